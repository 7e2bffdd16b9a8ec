#include "ebpf_metricsd/log2_histogram.h"

#include <cmath>
#include <numeric>

namespace ebpf_metricsd {

double Log2Layout::upper_bound(std::size_t i) const {
  // ldexp is exact; one division rounds once, so 2^k ns prints as e.g. 1.024e-06.
  return std::ldexp(1.0, min_log2 + static_cast<int>(i)) / units_per_base;
}

void Log2Layout::fold(std::span<const std::uint64_t> slots,
                      std::span<std::uint64_t> buckets) const {
  const std::size_t overflow = finite_buckets();
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] == 0) continue;
    const int exp = static_cast<int>(k);
    std::size_t b;
    if (exp <= min_log2) {
      b = 0;
    } else if (exp > max_log2) {
      b = overflow;
    } else {
      b = static_cast<std::size_t>(exp - min_log2);
    }
    buckets[b] += slots[k];
  }
}

std::uint64_t Log2HistogramState::count() const {
  return std::accumulate(buckets.begin(), buckets.end(), std::uint64_t{0});
}

std::vector<std::uint64_t> Log2HistogramState::cumulative() const {
  std::vector<std::uint64_t> out;
  if (buckets.empty()) return out;
  out.reserve(buckets.size() - 1);
  std::uint64_t running = 0;
  for (std::size_t i = 0; i + 1 < buckets.size(); ++i) {
    running += buckets[i];
    out.push_back(running);
  }
  return out;
}

}  // namespace ebpf_metricsd
