// offcpu_time: time tasks spend switched out while blocked, and context switches by kind;
// waits at or above its `slow` threshold with the stacks where the task blocked.
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/slow_capture.h"
#include "ebpf_metricsd/yaml_reader.h"
#include "sched_object.h"

namespace ebpf_metricsd {

namespace {

class OffcpuTimeTracer final : public SchedHistTracer {
 public:
  OffcpuTimeTracer(MetricScope& scope, const SchedLabelOptions& options, const TracerPeers& peers)
      : SchedHistTracer(scope,
                        {{"ebpf_offcpu_seconds",
                          "Time tasks spent switched out while blocked, until switched in again.",
                          MetricType::Histogram,
                          {},
                          {}},  // buckets from the options
                         /*wakeups=*/false,
                         [](scheduler* s) { return s->maps.offcpu_hist; },
                         [](scheduler* s) { return s->maps.offcpu_hist_labelled; },
                         SchedObject::kOffcpuMap,
                         drop_reasons<SCHED_DROP__COUNT>(
                             {"task_state", "", "map_full", "slow_limited", "slow_ring_full"})},
                        options, peers),
        switches_(scope, {{scope.declare({"ebpf_context_switches_total",
                                          "Context switches: voluntary (the task blocked) or "
                                          "involuntary (it was preempted while runnable).",
                                          MetricType::Counter,
                                          {"kind"}})}}),
        slow_(scope, metric(), "ebpf_offcpu_seconds", options.slow, cgroups()) {}

  void start(HookProber& prober, HookPreference preference) override {
    SchedHistTracer::start(prober, preference);
    slow_.start(skel()->maps.slow_events);
  }

  void drain() override {
    slow_.begin_drain();
    SchedHistTracer::drain();
    slow_.drain(
        [&](std::uint64_t, std::string_view comm) {
          return options().comm ? MetricStore::LabelValues{std::string(comm)}
                                : MetricStore::LabelValues{};
        },
        options().names());
    switches_.drain_array(
        bpf_map__fd(skel()->maps.switches), SCHED_SWITCH__COUNT, [](const void* key) {
          const auto k = *static_cast<const std::uint32_t*>(key);
          return MetricStore::LabelValues{k == SCHED_SWITCH_VOLUNTARY ? "voluntary"
                                                                      : "involuntary"};
        });
  }

 private:
  SeriesDrain switches_;
  SlowCapture slow_;  // after what it reads: its thread stops first
};

}  // namespace

TracerDescriptor offcpu_time_descriptor() {
  return declare_tracer<OffcpuTimeTracer>(
      "offcpu_time", "Off-CPU time while blocked, and context switches",
      [](YamlMapReader& options) {
        // 1us .. 64s: from a short lock wait to an idle worker.
        return SchedLabelOptions::read(options, Log2Layout::seconds(-20, 6), /*slow_capture=*/true);
      },
      {.group = "scheduler"});
}

}  // namespace ebpf_metricsd
