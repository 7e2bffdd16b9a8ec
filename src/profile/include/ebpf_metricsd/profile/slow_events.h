#pragma once
// Slow events with their stacks: what the tracers' `slow` capture sends from the kernel (a
// syscall, a wait... at or above its threshold), symbolized as it arrives, so that a process
// that exits later is still named, and kept for a while. Each histogram bucket that received
// slow events points to the latest as an exemplar whose `stack_id` is the id of its stack
// here; /debug/pprof/slow serves the stacks of a metric's slow events, or of one stack_id.
// Bounded: events older than the retention go, and at most max_events events and max_frames
// frames of their stacks are kept (the oldest events go first, counted). The metric store's
// lock is never taken.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

struct SlowEvent {
  std::string metric;  // the histogram it was counted in, e.g. ebpf_syscall_latency_seconds
  std::vector<std::pair<std::string, std::string>> series;  // that series' labels
  std::uint64_t latency_ns = 0;
  std::uint32_t pid = 0;
  std::uint32_t tid = 0;
  std::string comm;
  // Its user stack: false, where the thread that waited for it returned from the system call
  // it waited in; true, where the thread that started it was then (offcpu_time's: where it
  // blocked), by frame pointer (EMD_SLOW_TAKEN_* of bpf/common/slow.h).
  bool stack_at_start = false;
  CgroupLabel workload;
  std::chrono::system_clock::time_point when;
  std::uint64_t stack_id = 0;  // set by SlowEventStore::add
};

// The events a query matched, with the frames of their stacks (innermost first).
struct SlowWindow {
  std::chrono::system_clock::time_point begin, end;
  std::vector<SlowEvent> events;
  std::map<std::uint64_t, std::vector<Frame>> stacks;
};

// "00000000deadbeef": how a stack id is written in exemplars and queries.
std::string stack_id_text(std::uint64_t id);
std::optional<std::uint64_t> parse_stack_id(std::string_view text);

// How long profiles and slow events are kept unless `profiles.retention` says otherwise.
inline constexpr std::chrono::seconds kDefaultRetention{600};

class SlowEventStore {
 public:
  struct Limits {
    std::chrono::seconds retention = kDefaultRetention;
    std::size_t max_events = 100000;
    std::size_t max_frames = 500000;  // over all kept stacks: about 50 MB of names at most
  };
  explicit SlowEventStore(Limits limits) : limits_(limits) {}
  SlowEventStore() : SlowEventStore(Limits{}) {}
  // New limits (a reload): what is held stays, unless older than the new retention or past
  // the new bounds.
  void set_limits(Limits limits);

  // Keeps the event with its frames and returns its stack id: a hash of the named frames,
  // so that the same code path has the same id in every process and over time.
  std::uint64_t keep(SlowEvent e, std::vector<Frame> frames);

  struct Query {
    std::string metric;        // empty: every metric
    std::uint64_t min_ns = 0;  // latency at least
    std::optional<std::uint64_t> stack_id;
    std::chrono::system_clock::time_point since{};
    std::optional<std::chrono::system_clock::time_point> until;  // none: up to now
  };
  SlowWindow query(const Query& q) const;

  // Forgets events past the retention (also when no new ones come).
  void expire_old();

  std::size_t events_kept() const;
  std::size_t stacks_kept() const;
  std::size_t frames_kept() const;
  std::uint64_t dropped() const;  // events that went before their retention (max_events)

 private:
  void expire(std::chrono::system_clock::time_point now);  // caller holds mutex_

  Limits limits_;
  mutable std::mutex mutex_;      // for what is kept
  std::deque<SlowEvent> events_;  // oldest first
  std::size_t frames_ = 0;
  struct Stack {
    std::vector<Frame> frames;
    std::size_t events = 0;  // kept events that have it
  };
  std::map<std::uint64_t, Stack> stacks_;
  std::uint64_t dropped_ = 0;
};

// The matched events as a profile window of off-CPU samples, one per event, each as long as
// its latency: what the flame graph draws of them.
struct ProfileWindow;
ProfileWindow slow_profile_window(const SlowWindow& window);

// The matched events as a pprof profile: sample types events/count and latency/nanoseconds
// (the default), labels metric, the series' labels, stack_id, pid, tid, comm and the
// workload labels.
std::string pprof_slow(const SlowWindow& window);

}  // namespace ebpf_metricsd::profiling
