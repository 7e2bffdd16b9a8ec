#pragma once
// The profile's self-metrics (ebpf_metricsd_profile_*): what it recorded, what its caches
// and tables hold, what it refused to read, how the walks of user stacks ended. Published by
// the drain only: a cut made for a profile request takes no lock of the metric store.

#include <bpf/libbpf.h>

#include <array>
#include <cstdint>

#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/profile_capture.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

class ProfileMetrics {
 public:
  explicit ProfileMetrics(MetricScope& scope);
  // `walker`: the walk's process manager, and `walk_ends` the object's emd_unwind_ends, with
  // `unwind: cfi` (else nullptr).
  void publish(Profiles& profiles, ProfileCapture& capture, const ProcessManager* walker,
               const bpf_map* walk_ends);

 private:
  MetricScope& scope_;
  MetricScope::Metric caches_, memory_, refused_, no_lines_, no_mappings_, samples_, unwinds_,
      tables_;
  // What was published so far, of totals kept elsewhere.
  std::uint64_t lines_over_budget_ = 0, dwarf_broken_ = 0, jit_refused_ = 0, no_mappings_seen_ = 0,
                store_dropped_ = 0;
  WalkEnds walk_ends_{};
  std::array<std::uint64_t, kTableResults.size()> tables_seen_{};
  UserSymbols::Refusals refused_seen_{};
};

}  // namespace ebpf_metricsd::profiling
