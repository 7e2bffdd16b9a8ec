#pragma once
// A tracer's `slow` option: which of its events are sent with their stacks (slow_capture.h).

#include <cstdint>

namespace ebpf_metricsd {

class YamlMapReader;

struct SlowOptions {
  std::uint64_t threshold_ns = 0;  // 0: off
  std::uint32_t max_per_second = 100;
  bool on() const { return threshold_ns > 0; }
  // `slow: {threshold: 10ms, max_per_second: 100}` (threshold 1us .. 1h, at most 1000 a
  // second), absent: off.
  static SlowOptions read(YamlMapReader& options);
  // The ring buffer: two seconds of events at the limit, a power of two of pages.
  std::uint32_t ring_bytes() const;
  bool operator==(const SlowOptions&) const = default;
};

}  // namespace ebpf_metricsd
