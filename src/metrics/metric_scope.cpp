#include "ebpf_metricsd/metrics/metric_scope.h"

namespace ebpf_metricsd {

namespace {

MetricSpec dropped_events_spec() {
  return {"ebpf_metricsd_dropped_events_total",
          "Kernel events a tracer saw but could not record, by reason.",
          MetricType::Counter,
          {"tracer", "reason"}};
}

}  // namespace

MetricScope::MetricScope(MetricStore& store, std::string tracer)
    : store_(store),
      tracer_(std::move(tracer)),
      dropped_(store.declare(dropped_events_spec(), "core")) {}

MetricScope::Metric MetricScope::declare(const MetricSpec& spec) {
  return Metric(store_.declare(spec, tracer_));
}

void MetricScope::add(Metric m, const LabelValues& labels, std::uint64_t delta) {
  store_.add(m.id_, labels, delta);
}

void MetricScope::add_slots(Metric m, const LabelValues& labels,
                            std::span<const std::uint64_t> slots, std::uint64_t sum_delta) {
  store_.add_slots(m.id_, labels, slots, sum_delta);
}

void MetricScope::set(Metric m, const LabelValues& labels, double value) {
  store_.set(m.id_, labels, value);
}

void MetricScope::set_exemplar(Metric m, const LabelValues& labels, std::size_t slot,
                               Exemplar exemplar) {
  store_.set_exemplar(m.id_, labels, slot, std::move(exemplar));
}

void MetricScope::add_dropped(const std::string& reason, std::uint64_t n) {
  store_.add(dropped_, {tracer_, reason}, n);
}

}  // namespace ebpf_metricsd
