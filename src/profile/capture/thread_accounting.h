#pragma once
// Every thread's time, from the scheduler's own accounting, and the waits in progress: the
// profile's task iterator (profile_threads_*, 5.8+), read at each cut, and the threads that
// exited since (the map thread_ends). Not thread-safe: ProfileCapture calls it under its
// cut's lock.

#include <bpf/libbpf.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "stack_cache.h"

// clang-format off
#include <linux/types.h>
#include "profile.h"
// clang-format on

namespace ebpf_metricsd::profiling {

class ThreadAccounting {
 public:
  ThreadAccounting(StackCache& stacks, Symbolizer& symbolizer, CgroupNames* names, bool lines)
      : stacks_(stacks), symbolizer_(symbolizer), names_(names), lines_(lines) {}

  // Attaches `iterator` (the loaded one of profile_threads_*; nullptr: none loads) and reads
  // every thread's counts now, for the first cut to count from: the time threads ran before
  // the profile started is not the first window's. False, with a warning logged, where the
  // kernel has no task iterator: then windows have no accounting of threads and waits count
  // once they end.
  bool start(bpf_program* iterator, const bpf_map* thread_ends);
  bool running() const { return static_cast<bool>(link_); }

  // Every thread's accounting and wait now, then those that exited since the last call
  // (emptied from thread_ends). Call before the cut's stacks are read: the waits' kernel
  // stacks are among them.
  std::vector<profile_thread> now();
  // The threads' time since the last cut (each thread's from when it was last seen, or from
  // its start when it began since), and the waits in progress in `now`, with their stacks
  // appended to `stacks`; frames no cache holds go to `owned`, kept until the batch is added.
  std::vector<ThreadTime> account(const std::vector<profile_thread>& now,
                                  std::vector<Sample>& waiting, std::vector<StackView>& stacks,
                                  std::deque<std::vector<Frame>>& owned);

 private:
  StackView waiting_stack(const profile_thread& t, std::deque<std::vector<Frame>>& owned);

  StackCache& stacks_;
  Symbolizer& symbolizer_;
  CgroupNames* names_;  // with `cgroup: true`
  bool lines_;
  const bpf_map* thread_ends_ = nullptr;
  BpfLink link_;
  struct Seen {
    __u64 start = 0, on_cpu = 0, run_delay = 0;
  };
  std::unordered_map<__u32, Seen> seen_;  // each thread's values when last seen
  __u64 seen_at_ = 0;                     // when that was
  std::size_t exited_from_ = 0;           // where the exited threads begin in now()'s list
};

// A stack of one frame that says why there is none: no stack at all, or one the daemon no
// longer has.
std::span<const Frame> no_stack();
std::span<const Frame> stack_not_kept();

// A bpf_ktime_get_ns() time on the daemon's clock (both are CLOCK_MONOTONIC), and back.
inline Clock::time_point monotonic(std::uint64_t ns) {
  return Clock::time_point(std::chrono::nanoseconds(ns));
}
inline std::uint64_t ns_of(Clock::time_point t) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

}  // namespace ebpf_metricsd::profiling
