// net_xmit_latency: packet queue-to-transmit latency, packets and bytes, by interface.
#include <array>
#include <cstring>

#include <bpf/bpf.h>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/map_reader.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "ebpf_metricsd/tracers/tracer_options.h"

// clang-format off
#include <linux/types.h>
#include "net_xmit_latency.h"
#include "net_xmit_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(net_xmit_latency);

class NetXmitLatencyTracer final : public Tracer {
 public:
  using Options = OwnedHistogramOptions;
  NetXmitLatencyTracer(MetricScope& scope, const OwnedHistogramOptions& options)
      : scope_(scope),
        labels_(options.cgroup),
        latency_(scope.declare(labels_.with_labels(
            {"ebpf_net_xmit_queue_latency_seconds",
             "Time from a packet being queued for a device to the driver taking it, by "
             "interface.",
             MetricType::Histogram,
             {"interface"},
             options.buckets}))),
        packets_(scope.declare(labels_.with_labels({"ebpf_net_xmit_packets_total",
                                                    "Packets handed to the driver, by interface.",
                                                    MetricType::Counter,
                                                    {"interface"}}))),
        bytes_(scope.declare(labels_.with_labels({"ebpf_net_xmit_bytes_total",
                                                  "Bytes handed to the driver, by interface.",
                                                  MetricType::Counter,
                                                  {"interface"}}))),
        drops_(scope, drop_reasons<NETXMIT_DROP__COUNT>({"map_full", "map_full", "map_full"}),
               "unmatched_queue") {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 2> tps = {"net_dev_queue", "net_dev_xmit"};
    skel_ = Object::load_probed(scope_.tracer(), drops_, prober, tps, preference,
                                [this](net_xmit_latency* s, HookKind) {
                                  s->rodata->emd_by_cgroup = labels_.on();
                                  bpf_map__set_max_entries(s->maps.series_by_cgroup,
                                                           labels_.options().kernel_map_entries());
                                  auto& p = s->progs;
                                  // xmit before queue: a queue stamp without its xmit hook
                                  // would only go stale.
                                  return std::vector<HookTwin>{
                                      {p.net_dev_xmit_btf, p.net_dev_xmit_raw},
                                      {p.net_dev_queue_btf, p.net_dev_queue_raw},
                                  };
                                });
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(netxmit_value) == (NETXMIT_SLOTS + 3) * 8);
    // The same value in three maps: by cgroup when labelled, else by device slot, and by
    // name for the devices past the slots.
    if (labels_.on()) {
      labels_.drain<netxmit_cgroup_key>(cgroup_series_, skel_->maps.series_by_cgroup,
                                        [](const netxmit_cgroup_key& k) {
                                          return MetricStore::LabelValues{fixed_name(k.ifname)};
                                        });
    }
    dev_series_.drain_array(skel_->maps.dev_series, NETXMIT_DEV_SLOTS, [&](const void* key) {
      netxmit_dev dev{};
      if (!devs_) devs_ = read_map(skel_->maps.devs);
      if (!devs_->lookup(key, &dev)) throw BpfError("net_xmit_latency: no device slot");
      return MetricStore::LabelValues{fixed_name(dev.ifname)};
    });
    series_.drain_hash(skel_->maps.series, sizeof(netxmit_key), [](const void* key) {
      return MetricStore::LabelValues{fixed_name(static_cast<const netxmit_key*>(key)->ifname)};
    });
    drops_.drain();
    // A packet still not transmitted after 10 s was dropped on the way (or split into GSO
    // segments, which reach the driver as other skbs): its stamp is removed and counted.
    drops_.sweep(skel_->maps.queued_spilled, std::chrono::seconds(10));
  }

 private:
  MetricScope& scope_;
  CgroupLabels labels_;
  MetricScope::Metric latency_, packets_, bytes_;
  // Its value: {latency slots, sum of ns, packets, bytes}.
  SeriesDrain series_{scope_, {{latency_, NETXMIT_SLOTS}, {packets_}, {bytes_}}};
  SeriesDrain dev_series_{scope_, {{latency_, NETXMIT_SLOTS}, {packets_}, {bytes_}}};
  SeriesDrain cgroup_series_{scope_, {{latency_, NETXMIT_SLOTS}, {packets_}, {bytes_}}};
  DropAccounting drops_;
  Object skel_;
  std::unique_ptr<MapReader> devs_;  // of skel_'s device slots
};

}  // namespace

TracerDescriptor net_xmit_latency_descriptor() {
  // 100ns .. 1s: most packets reach the driver within a microsecond.
  return descriptor_with_owned_histogram<NetXmitLatencyTracer>(
      "net_xmit_latency", "Packet queue-to-transmit latency, packets and bytes, by interface",
      Log2Layout::seconds(-24, 0));
}

}  // namespace ebpf_metricsd
