// runqueue_latency: time from a task becoming runnable to it running.
#include <array>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "task_histogram.h"

// clang-format off
#include <linux/types.h>
#include "runqueue_latency.h"
#include "runqueue_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

class RunqueueLatencyTracer final : public Tracer {
 public:
  using Options = TaskHistogramOptions;
  RunqueueLatencyTracer(MetricScope& scope, const Options& options)
      : scope_(scope),
        hist_(scope,
              {"ebpf_runqueue_latency_seconds",
               "Time tasks spent runnable, waiting for a CPU (wakeup or preemption to running).",
               MetricType::Histogram,
               {},
               {}},  // labels and buckets from the options
              options),
        drops_(scope, drop_reasons<RUNQ_DROP__COUNT>({"task_state", "map_full"})) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 4> tracepoints = {"sched_wakeup", "sched_wakeup_new",
                                                           "sched_switch", "sched_process_free"};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tracepoints, preference,
        [&](runqueue_latency* s, HookKind kind) {
          configure_task_state(s->maps.runq_task, s->maps.runq_by_tid, kind);
          hist_.configure(s, s->maps.runq_hist_labelled);
          auto& p = s->progs;
          // sched_switch first: a wakeup's stamp without the switch
          // that ends it would go stale.
          std::vector<HookTwin> hooks = {{nullptr, p.runq_free}};
          for (const HookTwin& t : EBPF_METRICSD_SCHED_SWITCH_TWINS(p, sched_switch))
            hooks.push_back(t);
          hooks.push_back({p.sched_wakeup_btf, p.sched_wakeup_raw});
          hooks.push_back({p.sched_wakeup_new_btf, p.sched_wakeup_new_raw});
          return hooks;
        });
  }
  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    hist_.drain(skel_->maps.runq_hist, skel_->maps.runq_hist_labelled);
    drops_.drain();
  }

 private:
  using Object = EBPF_METRICSD_SKELETON(runqueue_latency);
  MetricScope& scope_;
  TaskHistogram hist_;
  DropAccounting drops_;
  Object skel_;  // last: detached and unloaded first
};

}  // namespace

TracerDescriptor runqueue_latency_descriptor() {
  return declare_tracer<RunqueueLatencyTracer>(
      "runqueue_latency", "Run-queue latency (runnable to running)", [](YamlMapReader& options) {
        // 1us .. 1s: a second's wait for a CPU is already an outage.
        return TaskHistogramOptions::read(options, Log2Layout::seconds(-20, 0),
                                          /*slow_capture=*/false);
      });
}

}  // namespace ebpf_metricsd
