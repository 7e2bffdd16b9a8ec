// tcp_connect_latency: active TCP opens, SYN_SENT to ESTABLISHED (latency) or CLOSE (failure).
#include <array>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/slow_capture.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "ebpf_metricsd/tracers/tracer_options.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "tcp_connect_latency.h"
#include "tcp_connect_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(tcp_connect_latency);

const char* family_name(std::uint32_t family) { return family == TCPCONN_IPV4 ? "ipv4" : "ipv6"; }

class TcpConnectLatencyTracer final : public Tracer {
 public:
  using Options = OwnedHistogramOptions;
  TcpConnectLatencyTracer(MetricScope& scope, const OwnedHistogramOptions& options,
                          const TracerContext& context)
      : scope_(scope),
        labels_(options.cgroup),
        latency_metric_(scope.declare(labels_.with_labels(
            {"ebpf_tcp_connect_latency_seconds",
             "Time from an active TCP open (SYN sent) to the connection being established.",
             MetricType::Histogram,
             {"family"},
             options.buckets}))),
        latency_(scope, {{latency_metric_, TCPCONN_SLOTS}}),
        failures_(scope, {{scope.declare(labels_.with_labels(
                             {"ebpf_tcp_connect_failures_total",
                              "Active TCP opens that went from SYN_SENT to CLOSE (refused, "
                              "timed out, reset).",
                              MetricType::Counter,
                              {"family"}}))}}),
        drops_(scope,
               drop_reasons<TCPCONN_DROP__COUNT>(
                   {"map_full", "map_full", "slow_limited", "slow_ring_full", "slow_origin_full"}),
               "never_finished"),
        slow_(scope, latency_metric_, "ebpf_tcp_connect_latency_seconds", options.slow, labels_,
              context.profiles, context.walker) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 3> tps = {"inet_sock_set_state", "sys_exit",
                                                   "sched_process_exit"};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tps, preference, [this](tcp_connect_latency* s, HookKind) {
          s->rodata->emd_by_cgroup = labels_.on();
          for (bpf_map* m : {s->maps.latency_by_cgroup, s->maps.failures_by_cgroup})
            bpf_map__set_max_entries(m, labels_.options().kernel_map_entries());
          slow_.configure(s, TCPCONN_MAX_IN_FLIGHT);
          // Held events' senders first: a mark is never left unread.
          std::vector<HookTwin> hooks = slow_return_hooks(s, slow_.options());
          hooks.push_back({s->progs.inet_sock_set_state_btf, s->progs.inet_sock_set_state_raw});
          return hooks;
        });
    slow_.start(skel_.get());
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    const auto family = [](std::uint32_t f) { return MetricStore::LabelValues{family_name(f)}; };
    slow_.begin_drain();
    labels_.drain_indexed(latency_, skel_->maps.latency_by_cgroup, skel_->maps.latency,
                          TCPCONN_FAMILIES, &tcpconn_cgroup_key::family, family);
    labels_.drain_indexed(failures_, skel_->maps.failures_by_cgroup, skel_->maps.failures,
                          TCPCONN_FAMILIES, &tcpconn_cgroup_key::family, family);
    static const std::vector<std::string> names = {"family"};
    slow_.drain(
        [&](std::uint64_t f, std::string_view) { return family(static_cast<std::uint32_t>(f)); },
        names);
    drops_.drain();
    // Every connect leaves SYN_SENT within the SYN retries (about two minutes); a stamp
    // older than ten minutes belongs to a socket that vanished unseen.
    drops_.sweep(skel_->maps.start, std::chrono::minutes(10));
  }

 private:
  MetricScope& scope_;
  CgroupLabels labels_;
  MetricScope::Metric latency_metric_;
  SeriesDrain latency_;
  SeriesDrain failures_;
  DropAccounting drops_;
  SlowCapture slow_;
  Object skel_;
};

}  // namespace

TracerDescriptor tcp_connect_latency_descriptor() {
  // 8us .. 64s: loopback connects take tens of us, SYN retransmits go on for a minute.
  return descriptor_with_owned_histogram<TcpConnectLatencyTracer>(
      "tcp_connect_latency", "TCP connect latency and failures, by family",
      Log2Layout::seconds(-17, 6), /*slow=*/true);
}

}  // namespace ebpf_metricsd
