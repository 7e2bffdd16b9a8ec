// softirq_latency: softirqs by vector: handler runs, the time from a raise to the handler
// starting, and the handler's run time.
#include <array>
#include <string>
#include <vector>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"

// clang-format off
#include <linux/types.h>
#include "softirq_latency.h"
#include "softirq_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

// The vectors as /proc/softirqs names them, lower case.
constexpr std::array<const char*, SOFTIRQ_VECTORS> kVectors = {
    "hi", "timer", "net_tx", "net_rx", "block", "irq_poll", "tasklet", "sched", "hrtimer", "rcu"};

class SoftirqLatencyTracer final : public Tracer {
 public:
  struct Options {
    Log2Layout buckets;
  };
  SoftirqLatencyTracer(MetricScope& scope, const Options& options)
      : scope_(scope),
        // The map's value: the handler runs, then two histograms (64 slots and the sum each).
        stats_(scope, {{scope.declare({"ebpf_softirqs_total",
                                       "Softirq handler runs, by vector (as /proc/softirqs).",
                                       MetricType::Counter,
                                       {"vector"}})},
                       {scope.declare({"ebpf_softirq_latency_seconds",
                                       "Time from a softirq being raised on a CPU to its "
                                       "handler starting there, by vector.",
                                       MetricType::Histogram,
                                       {"vector"},
                                       options.buckets}),
                        EMD_HIST_SLOTS},
                       {scope.declare({"ebpf_softirq_runtime_seconds",
                                       "Time a softirq handler ran, by vector.",
                                       MetricType::Histogram,
                                       {"vector"},
                                       options.buckets}),
                        EMD_HIST_SLOTS}}),
        drops_(scope, drop_reasons<SOFTIRQ_DROP__COUNT>(
                          {"unseen_raise", "unseen_entry", "unknown_vector"})) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 3> tracepoints = {"softirq_raise", "softirq_entry",
                                                           "softirq_exit"};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tracepoints, preference, [](softirq_latency* s, HookKind) {
          auto& p = s->progs;
          // Ends before starts: a start stamp without its end would go stale.
          return std::vector<HookTwin>{{p.softirq_exit_btf, p.softirq_exit_raw},
                                       {p.softirq_entry_btf, p.softirq_entry_raw},
                                       {p.softirq_raise_btf, p.softirq_raise_raw}};
        });
  }
  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(softirq_stats) == (1 + 2 * (EMD_HIST_SLOTS + 1)) * 8);
    stats_.drain_array(skel_->maps.stats, SOFTIRQ_VECTORS, [](const void* key) {
      return MetricStore::LabelValues{kVectors.at(*static_cast<const std::uint32_t*>(key))};
    });
    drops_.drain();
  }

 private:
  using Object = EBPF_METRICSD_SKELETON(softirq_latency);
  MetricScope& scope_;
  SeriesDrain stats_;
  DropAccounting drops_;
  Object skel_;  // last: detached and unloaded first
};

}  // namespace

TracerDescriptor softirq_latency_descriptor() {
  return declare_tracer<SoftirqLatencyTracer>(
      "softirq_latency", "Softirqs by vector: runs, raise-to-run latency and run time",
      [](YamlMapReader& options) {
        // 60 ns .. 62 ms: a softirq that waits or runs longer is already a stall.
        return SoftirqLatencyTracer::Options{read_buckets(options, Log2Layout::seconds(-24, -4))};
      },
      // a softirq runs on behalf of no task: no `cgroup` option
      TracerTraits{.owner = EventOwner::None});
}

}  // namespace ebpf_metricsd
