#pragma once
// What the daemon serves of its profiles: /debug/pprof/profile?seconds=N, the pprof of the
// next N seconds (as Go's net/http/pprof serves it, so that `go tool pprof URL` and pull
// collectors work); the flame graph page /profile and its data, /profile/data?seconds=N&
// group=process|workload|none, the last N seconds; /debug/pprof/slow?metric=M&min=D&
// stack_id=ID&seconds=N, the stacks of the tracers' slow events kept in the last N seconds
// (default and at most 600), each weighted by its latency.

#include <memory>
#include <vector>

#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/profile/profiles.h"

namespace ebpf_metricsd::profiling {

// The longest window one request may ask for.
inline constexpr int kMaxProfileSeconds = 300;
// Profile requests waiting at once; more get 503.
inline constexpr std::size_t kMaxProfileRequests = 4;
// Frames the flame graph page draws at most; the smallest fold into their callers.
inline constexpr std::size_t kMaxFlameGraphNodes = 20000;
// The flame graph's requests at once (its window is at most what the store keeps: the
// config's profiles.retention).
inline constexpr std::size_t kMaxFlameGraphRequests = 2;

std::vector<Route> profile_routes(const std::shared_ptr<Profiles>& profiles);

}  // namespace ebpf_metricsd::profiling
