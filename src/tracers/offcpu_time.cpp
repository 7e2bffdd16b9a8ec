// offcpu_time: time tasks spend switched out while blocked, and context switches by kind;
// waits at or above its `slow` threshold with the stacks where the task blocked.
#include <array>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/slow_capture.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "task_histogram.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "offcpu_time.h"
#include "offcpu_time.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

class OffcpuTimeTracer final : public Tracer {
 public:
  using Options = TaskHistogramOptions;
  OffcpuTimeTracer(MetricScope& scope, const Options& options, const TracerContext& context)
      : scope_(scope),
        options_(options),
        hist_(scope,
              {"ebpf_offcpu_seconds",
               "Time tasks spent switched out while blocked, until switched in again.",
               MetricType::Histogram,
               {},
               {}},  // labels and buckets from the options
              options),
        switches_(scope, {{scope.declare({"ebpf_context_switches_total",
                                          "Context switches: voluntary (the task blocked) or "
                                          "involuntary (it was preempted while runnable).",
                                          MetricType::Counter,
                                          {"kind"}})}}),
        drops_(scope,
               drop_reasons<OFFCPU_DROP__COUNT>({"task_state", "map_full", "slow_limited",
                                                 "slow_ring_full", "slow_exiting", "wake_missed"})),
        slow_(scope, hist_.metric(), "ebpf_offcpu_seconds", options.slow, hist_.cgroups(),
              context.profiles, context.walker) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 4> tracepoints = {"sched_switch", "sched_process_free",
                                                           "sys_exit", "sched_process_exit"};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tracepoints, preference,
        [&](offcpu_time* s, HookKind kind) {
          configure_task_state(s->maps.emd_offcpu_task, s->maps.emd_offcpu_by_tid, kind);
          hist_.configure(s, s->maps.offcpu_hist_labelled);
          slow_.configure(s, /*origins=*/0, /*keeps_stacks=*/true);
          // Held waits' senders first: a held wait is never left unread.
          std::vector<HookTwin> hooks = slow_return_hooks(s, slow_.options());
          hooks.push_back({nullptr, s->progs.emd_offcpu_free});
          for (const HookTwin& t : EBPF_METRICSD_SCHED_SWITCH_TWINS(s->progs, sched_switch))
            hooks.push_back(t);
          return hooks;
        });
    slow_.start(skel_.get());
  }
  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    slow_.begin_drain();
    hist_.drain(skel_->maps.offcpu_hist, skel_->maps.offcpu_hist_labelled);
    slow_.drain(
        [&](std::uint64_t, std::string_view comm) {
          return options_.comm ? MetricStore::LabelValues{std::string(comm)}
                               : MetricStore::LabelValues{};
        },
        options_.names());
    switches_.drain_array(skel_->maps.switches, OFFCPU_SWITCH__COUNT, [](const void* key) {
      const auto k = *static_cast<const std::uint32_t*>(key);
      return MetricStore::LabelValues{k == OFFCPU_SWITCH_VOLUNTARY ? "voluntary" : "involuntary"};
    });
    drops_.drain();
  }

 private:
  using Object = EBPF_METRICSD_SKELETON(offcpu_time);
  MetricScope& scope_;
  TaskHistogramOptions options_;
  TaskHistogram hist_;
  SeriesDrain switches_;
  DropAccounting drops_;
  SlowCapture slow_;
  Object skel_;  // last: detached and unloaded first, before the capture's reader stops
};

}  // namespace

TracerDescriptor offcpu_time_descriptor() {
  return declare_tracer<OffcpuTimeTracer>(
      "offcpu_time", "Off-CPU time while blocked, and context switches",
      [](YamlMapReader& options) {
        // 1us .. 64s: from a short lock wait to an idle worker.
        return TaskHistogramOptions::read(options, Log2Layout::seconds(-20, 6),
                                          /*slow_capture=*/true);
      });
}

}  // namespace ebpf_metricsd
