#pragma once
// Reading values back out of a MetricStore, for tests: collect() copies every series out as
// the exposition would show it (classic buckets in base units).

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ebpf_metricsd/metrics/metric_store.h"

namespace ebpf_metricsd::test {

using Labels = std::map<std::string, std::string>;

struct CollectedBucket {
  std::uint64_t cumulative_count = 0;
  double upper_bound = 0;
};
struct CollectedSeries {
  struct Label {
    std::string name, value;
  };
  std::vector<Label> label;
  struct {
    double value = 0;
  } counter, gauge;
  struct {
    std::uint64_t sample_count = 0;
    double sample_sum = 0;
    std::vector<CollectedBucket> bucket;  // finite ones
    std::vector<std::uint64_t> slots;     // the kernel's, as stored
  } histogram;
};
struct CollectedFamily {
  std::string name;
  MetricType type = MetricType::Counter;
  std::vector<CollectedSeries> metric;
};

inline std::vector<CollectedFamily> collect(const MetricStore& store) {
  struct Collector final : MetricVisitor {
    std::vector<CollectedFamily> out;
    const MetricSpec* spec = nullptr;
    void family(const MetricSpec& s) override {
      spec = &s;
      out.push_back({s.name, s.type, {}});
    }
    CollectedSeries& series(const std::vector<std::string>& labels) {
      CollectedSeries m;
      for (std::size_t i = 0; i < labels.size(); ++i)
        m.label.push_back({spec->labels[i], labels[i]});
      out.back().metric.push_back(std::move(m));
      return out.back().metric.back();
    }
    void counter(const std::vector<std::string>& labels, double value) override {
      series(labels).counter.value = value;
    }
    void gauge(const std::vector<std::string>& labels, double value) override {
      series(labels).gauge.value = value;
    }
    void histogram(const std::vector<std::string>& labels,
                   const Log2HistogramState& state) override {
      auto& h = series(labels).histogram;
      h.sample_count = state.count();
      h.sample_sum = static_cast<double>(state.sum_raw) / spec->buckets.units_per_base;
      std::vector<std::uint64_t> cumulative;
      spec->buckets.classic(state.slots, cumulative);
      for (std::size_t i = 0; i < cumulative.size(); ++i) {
        h.bucket.push_back({cumulative[i], spec->buckets.upper_bound(i)});
      }
      h.slots = state.slots;
    }
  } collector;
  store.visit(collector);
  return std::move(collector.out);
}

inline const CollectedSeries* find_series(const std::vector<CollectedFamily>& fams,
                                          const std::string& name, const Labels& labels) {
  for (const auto& f : fams) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      Labels have;
      for (const auto& l : m.label) have[l.name] = l.value;
      if (have == labels) return &m;
    }
  }
  return nullptr;
}

// Sample count of a histogram series, 0 when the series does not exist (yet).
inline std::uint64_t histogram_count(const MetricStore& store, const std::string& name,
                                     const Labels& labels) {
  const auto fams = test::collect(store);
  const auto* m = find_series(fams, name, labels);
  return m ? m->histogram.sample_count : 0;
}

// Sum of a histogram series, 0 when the series does not exist (yet).
inline double histogram_sum(const MetricStore& store, const std::string& name,
                            const Labels& labels) {
  const auto fams = test::collect(store);
  const auto* m = find_series(fams, name, labels);
  return m ? m->histogram.sample_sum : 0;
}

// Every counter series of `name` that has the labels `having` (and any others) and counted
// something, as " label=value ...: count;" each (its labels other than `having`), or " none":
// for failure messages.
inline std::string counters_text(const std::vector<CollectedFamily>& fams, const std::string& name,
                                 const Labels& having) {
  std::string text;
  for (const auto& f : fams) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      Labels have;
      for (const auto& l : m.label) have[l.name] = l.value;
      if (!std::includes(have.begin(), have.end(), having.begin(), having.end())) continue;
      if (m.counter.value == 0) continue;
      for (const auto& [k, v] : have) {
        if (!having.count(k)) text += " " + k + "=" + v;
      }
      text += ": " + std::to_string(static_cast<long long>(m.counter.value)) + ";";
    }
  }
  return text.empty() ? " none" : text;
}

inline double counter_value(const MetricStore& store, const std::string& name,
                            const Labels& labels) {
  const auto fams = test::collect(store);
  const auto* m = find_series(fams, name, labels);
  return m ? m->counter.value : 0;
}

inline double gauge_value(const MetricStore& store, const std::string& name, const Labels& labels) {
  const auto fams = test::collect(store);
  const auto* m = find_series(fams, name, labels);
  return m ? m->gauge.value : 0;
}

}  // namespace ebpf_metricsd::test
