#pragma once
// The BPF object shared by runqueue_latency and offcpu_time, so that sched_switch is hooked
// once however many of them run.

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_labels.h"
#include "ebpf_metricsd/cgroup_names.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/hook_probe.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/slow_options.h"
#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/yaml_reader.h"

// clang-format off
#include <linux/types.h>
#include "scheduler.h"
#include "scheduler.skel.h"
// clang-format on

namespace ebpf_metricsd {

class SchedHistTracer;

class SchedObject {
 public:
  // The kinds' labelled maps, by SchedHistKind::map.
  enum LabelledMap : std::size_t { kRunqMap = 0, kOffcpuMap = 1 };
  using MapEntries = std::array<std::uint32_t, 2>;

  // The live object with `user` among its users, or a newly loaded one with sched_switch
  // attached; the hook kind is chosen by whoever loads it first. A user whose labelled map
  // must hold another number of label sets than the live object's, or whose slow capture
  // differs from it, gets a new object, loaded with that size or capture and the live one's
  // hook kind, and the other users are moved onto it
  // (SchedHistTracer::link, then finish_move); the old one goes with its last user. `fresh`
  // tells whether nothing in the object counted yet (loaded now, no user moved onto it).
  static std::shared_ptr<SchedObject> acquire(HookProber& prober, HookPreference preference,
                                              SchedHistTracer& user, bool& fresh);
  // `user` no longer uses this object.
  void leave(SchedHistTracer& user);
  ~SchedObject();
  std::uint32_t label_sets(LabelledMap map) const { return entries_[map]; }
  // offcpu_time's slow capture, as loaded.
  const SlowOptions& slow() const { return slow_; }

  scheduler* skel() const { return skel_.get(); }
  bool raw() const { return kind_ == HookKind::RawTp; }
  std::string hook() const { return std::string(hook_name(kind_)); }
  bpf_program* switch_program() const;
  bpf_program* wakeup_program() const;
  bpf_program* wakeup_new_program() const;

 private:
  SchedObject() = default;
  void load(HookKind kind);  // open, load and attach sched_switch with programs of `kind`
  // A plain function pointer: the skeleton's functions are static, so they cannot be
  // template arguments of a type in a header.
  std::unique_ptr<scheduler, void (*)(scheduler*)> skel_{nullptr, scheduler__destroy};
  HookKind kind_ = HookKind::TpBtf;
  bool switch_3arg_ = false;  // sched_switch without prev_state (before 5.18)
  MapEntries entries_{};
  SlowOptions slow_;
  std::vector<SchedHistTracer*> users_;
  std::vector<BpfLink> links_;  // declared after skel_: detached first
};

// The options of the scheduler histograms: labels, buckets and (offcpu_time) slow capture.
struct SchedLabelOptions {
  CgroupLabelOptions cgroup;  // `cgroup`, and `label_map_entries` for either label
  bool comm = false;
  Log2Layout buckets;
  SlowOptions slow;
  static SchedLabelOptions read(YamlMapReader& options, const Log2Layout& default_buckets,
                                bool slow_capture);
  std::vector<std::string> names() const;
  MetricStore::LabelValues values(const sched_key& key, CgroupLabels& cgroups) const;
  bool labelled() const { return cgroup.on || comm; }
};

// One histogram tracer on the shared object: runqueue_latency and offcpu_time differ only
// in the data below.
struct SchedHistKind {
  MetricSpec spec;     // labels are appended per the options
  bool wants_wakeups;  // attach sched_wakeup/_new as well
  bool slow_capture;   // its `slow` option captures slow events
  std::uint8_t sched_config::*on;
  std::uint8_t sched_config::*by_cgroup;
  std::uint8_t sched_config::*by_comm;
  bpf_map* (*plain_map)(scheduler*);
  bpf_map* (*labelled_map)(scheduler*);
  SchedObject::LabelledMap map;           // the same map, as SchedObject names it
  std::vector<std::string> drop_reasons;  // by enum sched_drop_reason, "" = not ours
};

class SchedHistTracer : public Tracer {
 public:
  SchedHistTracer(MetricScope& scope, SchedHistKind kind, SchedLabelOptions labels);
  ~SchedHistTracer() override;
  void start(HookProber& prober, HookPreference preference) override;
  std::string hook() const override { return obj_->hook(); }
  void drain() override;

  SchedObject::LabelledMap labelled_map() const { return kind_.map; }
  // Label sets its labelled map must hold; nullopt when it has no labels (any size does).
  std::optional<std::uint32_t> label_sets() const;
  // The slow capture the object must be loaded with; nullopt when this kind has none.
  std::optional<SlowOptions> slow_capture() const;
  // Links of this kind's own programs (its wakeup hooks) in `obj`; may throw.
  std::vector<BpfLink> link(const SchedObject& obj) const;
  // Goes on with `obj`, a new object replacing the one it uses, whose programs `links`
  // (from link()) attached: drains the old maps a last time and switches over; the new
  // maps start empty. Tasks' periods in progress at that moment are not measured (the new
  // object has no stamp of their start).
  void finish_move(std::shared_ptr<SchedObject> obj, std::vector<BpfLink> links) noexcept;

 protected:
  scheduler* skel() const { return obj_->skel(); }
  // Counts already in the shared maps (the other tracer kept the object loaded) are the
  // baseline of the first drain, not new events. Overrides add their own drains.
  virtual void rebase_next();
  // The maps were replaced by empty ones: the next drain counts from zero.
  virtual void forget_counts();
  // This kind was switched on in the object it now uses (at start, and after a move).
  virtual void switched_on() {}
  MetricScope::Metric metric() const { return metric_; }
  const SchedLabelOptions& options() const { return labels_; }
  CgroupLabels& cgroups() { return cgroups_; }

 private:
  SchedHistKind kind_;
  SchedLabelOptions labels_;
  MetricScope::Metric metric_;
  Log2HistDrain hist_;
  DropAccounting drops_;
  CgroupLabels cgroups_;
  // Switches this kind on in obj_ (its programs linked); `fresh`: nothing in obj_ counted
  // yet, else what its maps hold is taken as the baseline first.
  void switch_on(bool fresh);
  std::shared_ptr<SchedObject> obj_;
  std::vector<BpfLink> links_;  // after obj_: detached before it is released
};

}  // namespace ebpf_metricsd
