#pragma once
// What the profile's kernel side (bpf/profile.bpf.c) hands over, read into the profile store
// at each cut: the aggregates of samples and waits (two maps the programs fill in turn), the
// stacks they name (emd_stacks), and every thread's accounting and wait in progress (the task
// iterator). tracers/profile.cpp loads and attaches the programs and calls cut(); the drain
// and a profile request may both ask for a cut.

#include <bpf/libbpf.h>
#include <linux/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/profile/profiles.h"

namespace ebpf_metricsd::profiling {

class StackCache;
class ThreadAccounting;

// The parts of the loaded profile object a capture reads.
struct ProfileObject {
  const bpf_map* counts[2] = {nullptr, nullptr};  // the aggregate maps, filled in turn
  const bpf_map* slot = nullptr;                  // which one the programs fill
  const bpf_map* stacks = nullptr;                // emd_stacks
  const bpf_map* thread_ends = nullptr;           // threads as they exited
  // The object's batch_begin_ns and batch_swapping (its .bss), written atomically.
  __u64* batch_begin_ns = nullptr;
  __u64* batch_swapping = nullptr;
  bpf_program* iterator = nullptr;  // the loaded profile_threads_*, or nullptr
};

class ProfileCapture {
 public:
  struct Options {
    bool cgroup = false;  // samples labelled by cgroup
    bool lines = false;   // user frames with source lines
    std::uint32_t max_stacks = 8192;
  };
  // `abandoned`: set by the daemon's exit (the tracer's abandon()): a cut in progress ends
  // after reading the kernel side, and no cut begins.
  ProfileCapture(Profiles& profiles, const ProfileObject& object, const Options& options,
                 const std::atomic<bool>& abandoned);
  ~ProfileCapture();
  ProfileCapture(const ProfileCapture&) = delete;
  ProfileCapture& operator=(const ProfileCapture&) = delete;

  // Starts the threads' accounting (the task iterator, where the kernel has one).
  void start();
  // Reads everything the kernel side aggregated since the last cut into one batch of the
  // store. Throws BpfError when the maps cannot be swapped (nothing is lost: the next cut
  // reads it).
  void cut();

  // Counts made by cuts since the last call, for the self-metrics.
  struct Counts {
    std::uint64_t on_cpu = 0, off_cpu = 0, stacks_expired = 0, collisions = 0;
  };
  Counts take_counts();
  // What the capture holds between cuts.
  struct Held {
    std::size_t stacks = 0, stack_bytes = 0, frame_bytes = 0;
  };
  Held held();

 private:
  Profiles& profiles_;
  ProfileObject object_;
  Options options_;
  std::mutex mutex_;  // one cut at a time: the drain's and a reader's
  std::unique_ptr<CgroupNames> names_;
  std::unique_ptr<StackCache> stacks_;
  std::unique_ptr<ThreadAccounting> threads_;
  int active_ = 0;  // the aggregate map the programs fill
  Counts counts_;
  Clock::time_point batch_begun_{};  // when the batch being gathered began: the last cut
  const std::atomic<bool>& abandoned_;
};

}  // namespace ebpf_metricsd::profiling
