#pragma once
// A tracer's kernel-side drop counters (a per-CPU array "drops" indexed by reason code), those
// of the headers of bpf/common/ its object includes (per-CPU arrays their owners register by
// name: register_shared_drops) and the recursion misses of its programs, as
// ebpf_metricsd_dropped_events_total.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/metrics/metric_scope.h"

namespace ebpf_metricsd {

// The names of a BPF drop enum's codes, in code order: exactly `Count` of them (the enum's
// __COUNT), checked at compile time. "" marks a code that belongs to another tracer sharing
// the map.
template <std::size_t Count, std::size_t N>
std::vector<std::string> drop_reasons(const char* const (&names)[N]) {
  static_assert(N == Count, "one name for each drop reason code of the BPF side");
  return std::vector<std::string>(names, names + N);
}

// A drop map that a header of bpf/common/ gives every object including it (by map name), and
// the names of its codes (from drop_reasons<>()): registered by the part of the daemon that
// owns the header, with a SharedDrops object at namespace scope in its source, so that this
// layer names no feature. bind() refuses an object with a map of a name nobody registered
// (every drop counted by name, none silently).
void register_shared_drops(std::string map, std::vector<std::string> reasons);
struct SharedDrops {
  SharedDrops(std::string map, std::vector<std::string> reasons) {
    register_shared_drops(std::move(map), std::move(reasons));
  }
};

class DropAccounting {
 public:
  // `reasons` from drop_reasons<>(); `swept_reason` names stale in-flight entries that
  // sweep() deletes ("" when the tracer has none).
  DropAccounting(MetricScope& scope, std::vector<std::string> reasons,
                 std::string swept_reason = {});
  // Call after load: the object whose drop maps to read, and the programs whose misses
  // count (the wanted ones of the list). Throws BpfError for a shared drop map (a map named
  // emd_*_drops or emd_*_ends) that no part registered.
  void bind(const bpf_object* obj, const std::vector<ProgramChoice>& programs);
  void drain();
  // Deletes stamps older than max_age from an in-flight map (sweep_stale_stamps) and counts
  // them under the swept reason.
  void sweep(const bpf_map* stamps, std::chrono::nanoseconds max_age);

 private:
  MetricScope& scope_;
  struct Table {
    const bpf_map* map;
    std::vector<std::string> reasons;
    PerCpuDeltas deltas{1};
  };
  std::vector<std::string> reasons_;
  std::string swept_reason_;
  std::vector<Table> tables_;
  std::vector<int> prog_fds_;
  std::uint64_t last_misses_ = 0;
};

}  // namespace ebpf_metricsd
