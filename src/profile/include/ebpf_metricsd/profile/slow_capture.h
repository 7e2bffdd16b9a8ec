#pragma once
// A tracer's `slow` option and what user space does with its slow events: the BPF side
// (bpf/common/slow.bpf.h) sends each event at or above the threshold with its stacks through
// a ring buffer; a RingReader of this class symbolizes the stacks as they arrive (so that a
// process that exits soon after is still named); the tracer's drain then keeps each event in
// the SlowEventStore and makes it the exemplar of its histogram bucket.

#include <bpf/libbpf.h>
#include <linux/types.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/ring_reader.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/profile/slow_events.h"
#include "ebpf_metricsd/profile/slow_options.h"

namespace ebpf_metricsd {

class SlowCapture {
 public:
  // Slow events of histogram `metric` (named `metric_name`); `labels`: the tracer's workload
  // labels (their series carry the exemplars too); `stacks`: where they are symbolized and
  // kept (nullptr: a store of its own, for exemplars only); `walker`: the daemon's walk of
  // user stacks in the kernel (nullptr: one of its own, with `unwind: cfi`).
  SlowCapture(MetricScope& scope, MetricScope::Metric metric, std::string metric_name,
              SlowOptions options, CgroupLabels& labels, profiling::Profiles* stacks,
              profiling::Walker* walker = nullptr);
  ~SlowCapture();
  SlowCapture(const SlowCapture&) = delete;
  SlowCapture& operator=(const SlowCapture&) = delete;

  const SlowOptions& options() const { return options_; }

  // Stacks kept by hash (emd_stacks) from an event's start to its end, at most (LRU: the
  // least recently used go first): lru_map_entries(4096).
  static std::uint32_t kept_stacks();

  // Before load: the BPF side's threshold, limit and ring size, and, with `unwind: cfi`, the
  // walker's maps (the daemon's). `origins`: for a tracer whose events end elsewhere than
  // they start (emd_slow_start), how many are kept at once; `keeps_stacks`: whether its
  // events keep stacks from start to end (emd_stacks) without origins.
  template <class Skeleton>
  void configure(Skeleton* s, std::uint32_t origins = 0, bool keeps_stacks = false) const {
    configure(s, options_, origins, keeps_stacks);
    if constexpr (requires { s->maps.emd_unwind_mappings; }) {
      if (walks()) walker().share(s->obj);
    }
  }
  template <class Skeleton>
  static void configure(Skeleton* s, const SlowOptions& options, std::uint32_t origins = 0,
                        bool keeps_stacks = false) {
    s->rodata->emd_slow_threshold_ns = options.threshold_ns;
    s->rodata->emd_slow_per_second = options.max_per_second;
    s->rodata->emd_slow_self_tgid = self_tgid();
    if constexpr (requires { s->rodata->emd_slow_unwind_cfi; }) {
      s->rodata->emd_slow_unwind_cfi = options.on() && options.unwind_cfi;
    }
    const bool on = options.on();
    bpf_map__set_max_entries(s->maps.slow_events, on ? options.ring_bytes() : 4096);
    bpf_map__set_max_entries(s->maps.slow_origins, on && origins ? origins : 1);
    bpf_map__set_max_entries(s->maps.emd_stacks,
                             on && (origins || keeps_stacks) ? kept_stacks() : 1);
  }
  // After load: starts reading the ring buffer `map` (when on).
  void start(bpf_map* map);
  // After load: starts reading the object's ring buffer; where its events can be held for
  // their starter's return (bpf/common/slow_return.bpf.h), sends those held too long; with
  // `unwind: cfi`, puts its walkers in place and counts how their walks end.
  template <class Skeleton>
  void start(Skeleton* s) {
    start(s->maps.slow_events);
    if constexpr (requires { s->maps.emd_slow_held; }) {
      hold_from(s->maps.emd_slow_held, s->maps.emd_stacks, &s->bss->emd_slow_swept);
    }
    if constexpr (requires { s->maps.emd_slow_walkers_btf; }) {
      if (walks()) {
        stacks_->symbolizer().set_file_source(
            [manager = &walker()](std::uint32_t id) { return manager->file(id); });
        profiling::set_walker(s->maps.emd_slow_walkers_btf, s->progs.emd_slow_walk_btf);
        profiling::set_walker(s->maps.emd_slow_walkers_raw, s->progs.emd_slow_walk_raw);
        walk_ends_ = s->maps.emd_unwind_ends;
      }
    }
  }
  // Whether its events' user stacks are walked in the kernel (`unwind: cfi`, on).
  bool walks() const { return options_.on() && options_.unwind_cfi; }
  // After load, for a tracer whose events are held until their starter returns from the
  // system call it waits in (bpf/common/slow_return.bpf.h; with `unwind: cfi`): the map of
  // held events, the stacks they refer to (emd_stacks) and the count of held events user
  // space took (emd_slow_swept). Each drain sends those held longer than kMaxHold with the
  // stacks from their start (counted as slow_return_late): a call that has not returned is
  // not waited for.
  void hold_from(bpf_map* held, bpf_map* stacks, __u64* swept);
  static constexpr std::chrono::seconds kMaxHold{10};
  // On the drain thread, before the tracer reads its histograms: takes what has arrived, so
  // that every event drain() then applies is already counted in the histogram it reads (the
  // kernel side counts an event before it sends it).
  void begin_drain();
  // On the drain thread, after: keeps what begin_drain took and sets the exemplars.
  // `series(key, label)`: the label values of the series the event was counted in (from its
  // key and label text), without the workload labels; `names`: their names.
  void drain(const std::function<MetricStore::LabelValues(std::uint64_t key,
                                                          std::string_view label)>& series,
             const std::vector<std::string>& names);

 private:
  struct Pending;
  void on_event(std::span<const std::byte> record);
  void sweep_held();
  static std::uint32_t self_tgid();
  profiling::ProcessManager& walker() const;

  MetricScope& scope_;
  MetricScope::Metric metric_;
  std::string metric_name_;
  SlowOptions options_;
  CgroupLabels& labels_;
  std::unique_ptr<profiling::Profiles> own_stacks_;
  profiling::Profiles* stacks_;
  std::mutex mutex_;
  std::deque<Pending> pending_;  // arrived, under mutex_
  std::size_t pending_frames_ = 0;
  std::uint64_t pending_dropped_ = 0;
  std::uint64_t stack_lost_ = 0;
  // Walks of user stacks, by how they ended (emd_unwind_ends); with `unwind: cfi`.
  std::optional<MetricScope::Metric> unwinds_metric_;
  const bpf_map* walk_ends_ = nullptr;
  profiling::WalkEnds walk_ends_seen_{};  // on the drain thread
  profiling::Walker* walker_;
  mutable std::unique_ptr<profiling::Walker> own_walker_;
  std::deque<Pending> taken_;  // by begin_drain, for drain
  std::uint64_t taken_dropped_ = 0;
  std::uint64_t taken_lost_ = 0;
  bpf_map* held_ = nullptr;
  bpf_map* held_stacks_ = nullptr;
  __u64* swept_ = nullptr;
  std::uint64_t late_ = 0;  // on the drain thread
  RingReader reader_;       // last: stops first
};

}  // namespace ebpf_metricsd
