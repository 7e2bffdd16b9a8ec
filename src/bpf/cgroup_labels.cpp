#include "ebpf_metricsd/bpf/cgroup_labels.h"

#include <mutex>

namespace ebpf_metricsd {

namespace {
std::shared_ptr<CgroupNames> shared_names() {
  static std::mutex mutex;
  static std::weak_ptr<CgroupNames> live;
  std::lock_guard lock(mutex);
  auto names = live.lock();
  if (!names) {
    names = std::make_shared<CgroupNames>();
    live = names;
  }
  return names;
}
}  // namespace

CgroupLabelOptions CgroupLabelOptions::read(YamlMapReader& options) {
  CgroupLabelOptions o;
  o.on = options.get_bool("cgroup", false);
  o.map_entries =
      static_cast<std::uint32_t>(options.get_int("label_map_entries", o.map_entries, 1, 1'000'000));
  return o;
}

CgroupLabels::CgroupLabels(CgroupLabelOptions options)
    : options_(options), names_(shared_names()) {}

MetricSpec CgroupLabels::with_labels(MetricSpec spec) const {
  if (options_.on) {
    for (const char* n : {"cgroup", "pod", "container"}) spec.labels.push_back(n);
  }
  return spec;
}

void CgroupLabels::append(MetricStore::LabelValues& values, std::uint64_t id) {
  if (!options_.on) return;
  CgroupLabel l = names_->label(id);
  values.push_back(std::move(l.cgroup));
  values.push_back(std::move(l.pod));
  values.push_back(std::move(l.container));
}

PerCpuDeltas::Retire CgroupLabels::retire(std::function<std::uint64_t(const void* key)> id_of) {
  return [this, id_of = std::move(id_of)](const void* key) { return names_->gone(id_of(key)); };
}

}  // namespace ebpf_metricsd
