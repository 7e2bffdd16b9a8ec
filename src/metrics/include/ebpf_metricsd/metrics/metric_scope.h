#pragma once
// What a tracer sees of the metric store: the metrics it declares and its own series of
// ebpf_metricsd_dropped_events_total. Owning, limiting and removing series is the business
// of the TracerSet that made the scope; a tracer cannot reach another tracer's series.

#include <cstdint>
#include <span>
#include <string>

#include "ebpf_metricsd/metrics/metric_store.h"

namespace ebpf_metricsd {

class MetricScope {
 public:
  // A metric declared through a scope; only a scope makes one.
  class Metric {
   private:
    friend class MetricScope;
    explicit Metric(MetricStore::MetricId id) : id_(id) {}
    MetricStore::MetricId id_;
  };
  using LabelValues = MetricStore::LabelValues;

  MetricScope(MetricStore& store, std::string tracer);
  MetricScope(const MetricScope&) = delete;
  MetricScope& operator=(const MetricScope&) = delete;

  const std::string& tracer() const { return tracer_; }

  // Declares a metric of this tracer (see MetricStore::declare); a restarted tracer that
  // declares it again carries on counting.
  Metric declare(const MetricSpec& spec);
  void add(Metric m, const LabelValues& labels, std::uint64_t delta);
  void add_slots(Metric m, const LabelValues& labels, std::span<const std::uint64_t> slots,
                 std::uint64_t sum_delta);
  void set(Metric m, const LabelValues& labels, double value);
  void set_exemplar(Metric m, const LabelValues& labels, std::size_t slot, Exemplar exemplar);
  // ebpf_metricsd_dropped_events_total{tracer=<this tracer>, reason}.
  void add_dropped(const std::string& reason, std::uint64_t n);

 private:
  MetricStore& store_;
  std::string tracer_;
  MetricStore::MetricId dropped_;
};

}  // namespace ebpf_metricsd
