#pragma once
// The BPF object shared by runqueue_latency and offcpu_time, so that sched_switch is hooked
// once however many of them run.

#include <array>
#include <memory>
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

// What the shared object is loaded with: each kind's part, from the enabled tracers' options.
struct SchedPlan {
  struct Kind {
    bool on = false;
    bool by_cgroup = false;
    bool by_comm = false;
    std::uint32_t label_sets = 1;  // its labelled map's entries
    bool operator==(const Kind&) const = default;
  };
  std::array<Kind, 2> kinds{};  // by SchedObject::LabelledMap
  SlowOptions slow;             // offcpu_time's capture
  HookPreference preference = HookPreference::Auto;
  bool operator==(const SchedPlan&) const = default;
};

class SchedObject {
 public:
  // The kinds' labelled maps, by SchedHistKind::map.
  enum LabelledMap : std::size_t { kRunqMap = 0, kOffcpuMap = 1 };

  // The object loaded with `plan`, its programs attached: the live one when it was loaded
  // with the same plan, else a new one (`drops` bound to it). Nothing in an object changes
  // after it is loaded: a tracer with other options gets another object, and the old one
  // goes with its last user.
  static std::shared_ptr<SchedObject> get(const SchedPlan& plan, HookProber& prober,
                                          DropAccounting& drops);
  ~SchedObject();
  SchedObject(const SchedObject&) = delete;
  SchedObject& operator=(const SchedObject&) = delete;

  scheduler* skel() const;
  const std::string& hook() const;
  // The programs a kind runs, for its drop accounting: sched_switch, and with `wakeups`
  // sched_wakeup and sched_wakeup_new.
  std::vector<ProgramChoice> programs(bool wakeups) const;

 private:
  explicit SchedObject(const SchedPlan& plan);
  // Its LoadedSkeleton (in sched_object.cpp: the type names the skeleton's functions, which
  // are static in each file that includes the skeleton).
  struct Loaded;
  std::unique_ptr<Loaded> loaded_;
  SchedPlan plan_;
  std::vector<ProgramChoice> switch_programs_, wakeup_programs_;
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
  MetricSpec spec;  // labels are appended per the options
  bool wakeups;     // its events start at sched_wakeup and sched_wakeup_new too
  bpf_map* (*plain_map)(scheduler*);
  bpf_map* (*labelled_map)(scheduler*);
  SchedObject::LabelledMap map;           // the same map, as SchedObject names it
  std::vector<std::string> drop_reasons;  // by enum sched_drop_reason, "" = not ours
};

class SchedHistTracer : public Tracer {
 public:
  using Options = SchedLabelOptions;
  // `peers`: the options of both scheduler tracers where enabled, which size the object.
  SchedHistTracer(MetricScope& scope, SchedHistKind kind, SchedLabelOptions labels,
                  const TracerPeers& peers);
  void start(HookProber& prober, HookPreference preference) override;
  std::string hook() const override { return obj_->hook(); }
  void drain() override;

 protected:
  scheduler* skel() const { return obj_->skel(); }
  MetricScope::Metric metric() const { return metric_; }
  const SchedLabelOptions& options() const { return labels_; }
  CgroupLabels& cgroups() { return cgroups_; }

 private:
  SchedHistKind kind_;
  SchedLabelOptions labels_;
  SchedPlan plan_;
  MetricScope::Metric metric_;
  SeriesDrain hist_;
  DropAccounting drops_;
  CgroupLabels cgroups_;
  std::shared_ptr<SchedObject> obj_;
};

}  // namespace ebpf_metricsd
