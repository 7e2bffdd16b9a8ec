#pragma once

#include <time.h>

#include <cstdint>

namespace ebpf_metricsd {

// Now on CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns(), so times the BPF
// programs record compare with it directly.
inline std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace ebpf_metricsd
