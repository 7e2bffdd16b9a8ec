#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ebpf_metricsd/log2_histogram.h"

namespace ebpf_metricsd {

enum class MetricType { Counter, Gauge, Histogram };

// A metric declared as data: the shared drain code and the store do the rest.
struct MetricSpec {
  std::string name;
  std::string help;
  MetricType type = MetricType::Counter;
  std::vector<std::string> labels;
  Log2Layout buckets{};         // histograms
  double units_per_base = 1.0;  // counters: raw units per exported unit
};

// All series the daemon exports, kept as exact integers until they are serialized.
// Counters and histograms only ever grow; the drain adds deltas to them.
class MetricStore : public prometheus::Collectable {
 public:
  using MetricId = std::size_t;
  using LabelValues = std::vector<std::string>;

  // Declares a metric; declaring the same spec again returns the same id. Throws
  // std::invalid_argument for an invalid name or a conflicting redeclaration.
  MetricId declare(const MetricSpec& spec);

  void add(MetricId id, const LabelValues& labels, std::uint64_t delta);
  void set(MetricId id, const LabelValues& labels, double value);
  // Adds per-slot deltas of a kernel log2 histogram and the raw sum delta.
  void add_slots(MetricId id, const LabelValues& labels, std::span<const std::uint64_t> slots,
                 std::uint64_t sum_delta);

  std::vector<prometheus::MetricFamily> Collect() const override;

  std::size_t series_count() const;

 private:
  using Series = std::variant<std::uint64_t, double, Log2HistogramState>;
  struct Metric {
    MetricSpec spec;
    std::map<LabelValues, Series> series;
  };
  Series& series_for(Metric& m, const LabelValues& labels);

  mutable std::mutex mutex_;
  std::vector<Metric> metrics_;
};

// Replaces bytes that are not valid UTF-8 with U+FFFD, so label values taken from the
// kernel (a comm cut mid-character, a device name) always serialize validly.
std::string sanitize_utf8(std::string_view in);

}  // namespace ebpf_metricsd
