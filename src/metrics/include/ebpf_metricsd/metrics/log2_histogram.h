#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ebpf_metricsd {

class YamlMapReader;

// How the kernel's histogram slots (bpf/common/log2_slot.h) are exported. Every slot is a
// power of two of the exported unit (seconds, bytes): slot 0 holds only zero and is the
// native histogram's zero bucket (threshold 2^zero_exp); slot k >= 1 holds (2^(e-1), 2^e]
// with e = zero_exp + k, which is bucket e of a native histogram of schema 0. The classic
// buckets are le = 2^min_exp .. 2^max_exp: slots below fold into the first, slots above
// count only towards +Inf.
struct Log2Layout {
  static constexpr std::size_t kSlots = 64;  // EMD_HIST_SLOTS
  double units_per_base = 1e9;               // raw units (ns, bytes) per exported unit
  int zero_exp = -30;
  int min_exp = 0;
  int max_exp = 0;

  // Latencies counted in ns, exported in seconds; bytes.
  static Log2Layout seconds(int min_exp, int max_exp);
  static Log2Layout bytes(int min_exp, int max_exp);
  bool is_seconds() const { return units_per_base != 1.0; }

  std::size_t finite_buckets() const { return static_cast<std::size_t>(max_exp - min_exp) + 1; }
  // Upper bound of classic bucket i: exactly 2^(min_exp + i).
  double upper_bound(std::size_t i) const;
  // Exponent of slot k >= 1 (its native bucket index under schema 0).
  int exponent(std::size_t slot) const { return zero_exp + static_cast<int>(slot); }
  double zero_threshold() const;
  // Cumulative counts of the classic finite buckets.
  void classic(std::span<const std::uint64_t> slots, std::vector<std::uint64_t>& cumulative) const;
  bool operator==(const Log2Layout&) const = default;
};

// The tracer option `buckets: {min: ..., max: ...}`: the classic bucket range, as
// durations ("1us", "250ms", "16s") for a seconds layout and sizes ("8", "4KiB") for a
// bytes one. min rounds down and max up to powers of two. Returns `defaults` without the key.
Log2Layout read_buckets(YamlMapReader& options, const Log2Layout& defaults);
// A duration as bucket bounds are written ("750us", "10ms", "1.5s"; ns, us, ms, s, m, h), in
// nanoseconds. Throws std::invalid_argument for anything else, or for 0 or less.
std::uint64_t parse_nanoseconds(const std::string& text);

// One observed event that a histogram bucket points to: its labels (together at most
// kMaxExemplarLabelChars characters of names and values, as OpenMetrics allows), its value
// in the exported unit and when it happened (seconds since the epoch).
struct Exemplar {
  static constexpr std::size_t kMaxExemplarLabelChars = 128;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
  double timestamp = 0;
};

// Cumulative state of one histogram series: the kernel's slots as they are, in raw units.
struct Log2HistogramState {
  std::vector<std::uint64_t> slots;  // Log2Layout::kSlots
  std::uint64_t sum_raw = 0;
  std::map<std::size_t, Exemplar> exemplars;  // by slot: the latest event recorded in it

  std::uint64_t count() const;
};

// The exemplar classic bucket i (0 .. finite_buckets(); finite_buckets() is +Inf) carries:
// the latest of those of the slots that bucket holds alone (below min_exp the first, above
// max_exp +Inf), or nullptr.
const Exemplar* classic_exemplar(const Log2Layout& layout, const Log2HistogramState& state,
                                 std::size_t bucket);

// A native histogram's buckets as Prometheus' protobuf carries them: spans of consecutive
// bucket indexes and the counts as deltas, each to the previous bucket's count.
struct NativeBuckets {
  struct Span {
    std::int32_t offset;  // from the end of the previous span, or the first index
    std::uint32_t length;
  };
  std::vector<Span> spans;
  std::vector<std::int64_t> deltas;
};
// Slots 1.. of `slots` as native buckets. Gaps of up to two empty buckets stay inside a span
// (as zero counts), which encodes shorter than a new span.
NativeBuckets native_buckets(const Log2Layout& layout, std::span<const std::uint64_t> slots);

}  // namespace ebpf_metricsd
