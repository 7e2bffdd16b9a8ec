#pragma once
// Reading values back out of a MetricStore, for tests.

#include <prometheus/metric_family.h>

#include <cstdint>
#include <map>
#include <string>

#include "ebpf_metricsd/metric_store.h"

namespace ebpf_metricsd::test {

using Labels = std::map<std::string, std::string>;

inline const prometheus::ClientMetric* find_series(
    const std::vector<prometheus::MetricFamily>& fams, const std::string& name,
    const Labels& labels) {
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
  const auto fams = store.Collect();
  const auto* m = find_series(fams, name, labels);
  return m ? m->histogram.sample_count : 0;
}

inline double counter_value(const MetricStore& store, const std::string& name,
                            const Labels& labels) {
  const auto fams = store.Collect();
  const auto* m = find_series(fams, name, labels);
  return m ? m->counter.value : 0;
}

}  // namespace ebpf_metricsd::test
