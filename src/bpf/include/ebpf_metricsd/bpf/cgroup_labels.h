#pragma once
// The `cgroup: true` option of a tracer: its kernel side keys a per-CPU hash by the owner's
// cgroup id (in place of its plain array), and the drain turns the id into the workload
// labels `cgroup`, `pod` and `container` (cgroup_names.h). Entries of cgroups that are gone
// are deleted from the map once idle, so churn does not fill it.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/metrics/metric_store.h"

namespace ebpf_metricsd {

struct CgroupLabelOptions {
  bool on = false;
  // `label_map_entries`: distinct label sets the kernel map holds; events of a set that
  // finds it full count as dropped_events_total{reason="map_full"}.
  std::uint32_t map_entries = 4096;
  static CgroupLabelOptions read(YamlMapReader& options);
  // Where the tracer's map should be sized: 1 when labels are off (the map is made but
  // never used).
  std::uint32_t kernel_map_entries() const { return on ? map_entries : 1; }
};

class CgroupLabels {
 public:
  explicit CgroupLabels(CgroupLabelOptions options);
  bool on() const { return options_.on; }
  const CgroupLabelOptions& options() const { return options_; }
  // Appends cgroup, pod, container to a metric's labels (when on).
  MetricSpec with_labels(MetricSpec spec) const;
  // Call at the start of each drain.
  void begin_pass() { names_->begin_pass(); }
  // Appends the label values of cgroup `id` (when on).
  void append(MetricStore::LabelValues& values, std::uint64_t id);
  // The labels of cgroup `id` ("unknown" when it is gone and was never named).
  CgroupLabel label(std::uint64_t id) { return names_->label(id); }
  // For drain_hash: retires idle entries whose cgroup is gone. `id_of` reads the id from
  // a key.
  PerCpuDeltas::Retire retire(std::function<std::uint64_t(const void* key)> id_of);

  // One drain of a labelled map whose key is a struct `Key` with a `cgroup` id: `own(key)`
  // gives the tracer's own label values, the workload labels are appended, idle entries
  // of gone cgroups retired. `Drain` is a SeriesDrain.
  template <typename Key, typename Drain, typename Own>
  void drain(Drain& drain, const bpf_map* map, const Own& own) {
    begin_pass();
    drain.drain_hash(
        map, sizeof(Key),
        [&](const void* key) {
          const Key& k = *static_cast<const Key*>(key);
          MetricStore::LabelValues v = own(k);
          append(v, k.cgroup);
          return v;
        },
        retire([](const void* key) { return static_cast<const Key*>(key)->cgroup; }));
  }
  // One drain of a tracer that counts by a u32 index: in the labelled map keyed by
  // {cgroup, index} (the index the key's member `index`) when labels are on, else in the
  // plain array of `entries` indexed by it. `own(index)` gives the tracer's own label values.
  template <typename Key, typename Drain, typename Own>
  void drain_indexed(Drain& drain, const bpf_map* labelled, const bpf_map* plain,
                     std::uint32_t entries, std::uint32_t Key::*index, const Own& own) {
    if (on()) {
      this->drain<Key>(drain, labelled, [&](const Key& k) { return own(k.*index); });
    } else {
      drain.drain_array(plain, entries, [&](const void* key) {
        return own(*static_cast<const std::uint32_t*>(key));
      });
    }
  }

 private:
  CgroupLabelOptions options_;
  std::shared_ptr<CgroupNames> names_;  // one per process: one cache, one scan per miss
};

}  // namespace ebpf_metricsd
