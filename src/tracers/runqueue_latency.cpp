// runqueue_latency: time from a task becoming runnable to it running.
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/yaml_reader.h"
#include "sched_object.h"

namespace ebpf_metricsd {

TracerDescriptor runqueue_latency_descriptor() {
  return {
      "runqueue_latency",
      "Run-queue latency (runnable to running)",
      [](YamlMapReader& options) -> std::any {
        // 1us .. 1s: a second's wait for a CPU is already an outage.
        return SchedLabelOptions::read(options, Log2Layout::seconds(-20, 0),
                                       /*slow_capture=*/false);
      },
      [](MetricScope& scope, const std::any& options) -> std::unique_ptr<Tracer> {
        SchedHistKind kind{
            {"ebpf_runqueue_latency_seconds",
             "Time tasks spent runnable, waiting for a CPU (wakeup or preemption to running).",
             MetricType::Histogram,
             {},
             {}},  // buckets from the options
            /*wants_wakeups=*/true,
            /*slow_capture=*/false,
            &sched_config::runq_on,
            &sched_config::runq_by_cgroup,
            &sched_config::runq_by_comm,
            [](scheduler* s) { return s->maps.runq_hist; },
            [](scheduler* s) { return s->maps.runq_hist_labelled; },
            SchedObject::kRunqMap,
            drop_reasons<SCHED_DROP__COUNT>({"task_state", "map_full", "", "", ""}),
        };
        return std::make_unique<SchedHistTracer>(scope, std::move(kind),
                                                 std::any_cast<SchedLabelOptions>(options));
      },
  };
}

}  // namespace ebpf_metricsd
