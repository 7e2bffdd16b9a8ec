#pragma once
// A tracer's `slow` option: which of its events are sent with their stacks (slow_capture.h).

#include <cstdint>

namespace ebpf_metricsd {

class YamlMapReader;

struct SlowOptions {
  std::uint64_t threshold_ns = 0;  // 0: off
  std::uint32_t max_per_second = 100;
  // Events waited for inside a system call sent when it returns, with a copy of the user
  // stack unwound with CFI (`unwind: cfi`), or all walked by frame pointer where they
  // begin (`unwind: frame_pointers`).
  bool unwind_cfi = false;
  // User frames with their source lines where DWARF is on the host (`lines: true`).
  bool lines = false;
  bool on() const { return threshold_ns > 0; }
  // `slow: {threshold: 10ms, max_per_second: 100, unwind: cfi, lines: false}` (threshold
  // 1us .. 1h, at most 1000 a second), absent: off.
  static SlowOptions read(YamlMapReader& options);
  // The ring buffer: two seconds of events at the limit, a power of two of pages.
  std::uint32_t ring_bytes() const;
  bool operator==(const SlowOptions&) const = default;
};

}  // namespace ebpf_metricsd
