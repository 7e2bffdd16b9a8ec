#pragma once
// A profile window as a pprof profile (proto/profile.proto), the format of
// /debug/pprof/profile: sample types samples/count, cpu/nanoseconds and off_cpu/nanoseconds;
// labels pid, tid, comm, state and the workload labels; one mapping per module with its
// build-id; functions already named (the daemon symbolizes).

#include <cstdint>
#include <string>

#include "ebpf_metricsd/profile/profile_store.h"

namespace ebpf_metricsd::profiling {

// The serialized Profile message.
std::string pprof_profile(const ProfileWindow& window);

}  // namespace ebpf_metricsd::profiling
