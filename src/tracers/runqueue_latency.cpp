// runqueue_latency: time from a task becoming runnable to it running.
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/yaml_reader.h"
#include "sched_object.h"

namespace ebpf_metricsd {

namespace {

class RunqueueLatencyTracer final : public SchedHistTracer {
 public:
  RunqueueLatencyTracer(MetricScope& scope, const SchedLabelOptions& options,
                        const TracerPeers& peers)
      : SchedHistTracer(
            scope,
            {{"ebpf_runqueue_latency_seconds",
              "Time tasks spent runnable, waiting for a CPU (wakeup or preemption to running).",
              MetricType::Histogram,
              {},
              {}},  // buckets from the options
             /*wakeups=*/true,
             [](scheduler* s) { return s->maps.runq_hist; },
             [](scheduler* s) { return s->maps.runq_hist_labelled; },
             SchedObject::kRunqMap,
             drop_reasons<SCHED_DROP__COUNT>({"task_state", "map_full", "", "", ""})},
            options, peers) {}
};

}  // namespace

TracerDescriptor runqueue_latency_descriptor() {
  return declare_tracer<RunqueueLatencyTracer>(
      "runqueue_latency", "Run-queue latency (runnable to running)",
      [](YamlMapReader& options) {
        // 1us .. 1s: a second's wait for a CPU is already an outage.
        return SchedLabelOptions::read(options, Log2Layout::seconds(-20, 0),
                                       /*slow_capture=*/false);
      },
      {.group = "scheduler"});
}

}  // namespace ebpf_metricsd
