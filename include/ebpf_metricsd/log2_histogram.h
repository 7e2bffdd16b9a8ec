#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ebpf_metricsd {

// How kernel log2 slots become Prometheus buckets. Kernel slot k counts values in
// (2^(k-1), 2^k] raw units (bpf/common/log2_slot.h), so bucket "le" = 2^k / units_per_base
// is exact. Slots below min_log2 fold into the first bucket; slots above max_log2 only
// count towards +Inf.
struct Log2Layout {
  double units_per_base = 1.0;  // 1e9 for ns -> seconds, 1 for bytes
  int min_log2 = 0;
  int max_log2 = 0;

  std::size_t finite_buckets() const { return static_cast<std::size_t>(max_log2 - min_log2 + 1); }
  // Upper bound of finite bucket i, in base units.
  double upper_bound(std::size_t i) const;
  // Adds per-slot kernel counts into per-bucket counts (size finite_buckets() + 1, the last
  // being the overflow that only +Inf includes).
  void fold(std::span<const std::uint64_t> slots, std::span<std::uint64_t> buckets) const;
  bool operator==(const Log2Layout&) const = default;
};

// Cumulative state of one histogram series, in raw units.
struct Log2HistogramState {
  std::vector<std::uint64_t> buckets;  // non-cumulative, finite_buckets() + 1
  std::uint64_t sum_raw = 0;

  std::uint64_t count() const;
  // Cumulative count of finite bucket i ("le" semantics).
  std::vector<std::uint64_t> cumulative() const;
};

}  // namespace ebpf_metricsd
