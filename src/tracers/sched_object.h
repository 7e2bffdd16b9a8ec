#pragma once
// The BPF object shared by runqueue_latency and offcpu_time, so that sched_switch is hooked
// once however many of them run.

#include <memory>
#include <string>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_names.h"
#include "ebpf_metricsd/hook_probe.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/yaml_reader.h"

// clang-format off
#include <linux/types.h>
#include "scheduler.h"
#include "scheduler.skel.h"
// clang-format on

namespace ebpf_metricsd {

class SchedObject {
 public:
  // The live object, or a newly loaded one with sched_switch attached. The hook kind is
  // chosen by whoever loads it first.
  // `fresh` tells whether it was loaded now (its maps empty) or was already live.
  static std::shared_ptr<SchedObject> acquire(HookProber& prober, HookPreference preference,
                                              bool& fresh);
  ~SchedObject();

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
  bool switch_3arg_ = false;    // sched_switch without prev_state (before 5.18)
  std::vector<BpfLink> links_;  // declared after skel_: detached first
};

// The optional labels of the scheduler histograms.
struct SchedLabelOptions {
  bool cgroup = false;
  bool comm = false;
  Log2Layout buckets;
  static SchedLabelOptions read(YamlMapReader& options, const Log2Layout& default_buckets);
  std::vector<std::string> names() const;
  MetricStore::LabelValues values(const sched_key& key, CgroupLabels& cgroups) const;
};

// One histogram tracer on the shared object: runqueue_latency and offcpu_time differ only
// in the data below.
struct SchedHistKind {
  MetricSpec spec;     // labels are appended per the options
  bool wants_wakeups;  // attach sched_wakeup/_new as well
  std::uint8_t sched_config::*on;
  std::uint8_t sched_config::*by_cgroup;
  std::uint8_t sched_config::*by_comm;
  bpf_map* (*plain_map)(scheduler*);
  bpf_map* (*labelled_map)(scheduler*);
  std::vector<std::string> drop_reasons;  // by enum sched_drop_reason, "" = not ours
};

class SchedHistTracer : public Tracer {
 public:
  SchedHistTracer(MetricScope& scope, SchedHistKind kind, SchedLabelOptions labels);
  ~SchedHistTracer() override;
  void start(HookProber& prober, HookPreference preference) override;
  std::string hook() const override { return obj_->hook(); }
  void drain() override;

 protected:
  scheduler* skel() const { return obj_->skel(); }
  // Counts already in the shared maps (the other tracer kept the object loaded) are the
  // baseline of the first drain, not new events. Overrides add their own drains.
  virtual void rebase_next();

 private:
  SchedHistKind kind_;
  SchedLabelOptions labels_;
  Log2HistDrain hist_;
  DropAccounting drops_;
  CgroupLabels cgroups_;
  std::shared_ptr<SchedObject> obj_;
  std::vector<BpfLink> links_;  // after obj_: detached before it is released
};

}  // namespace ebpf_metricsd
