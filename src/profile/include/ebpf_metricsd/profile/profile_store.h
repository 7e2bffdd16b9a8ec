#pragma once
// What the profile tracer saw, named, kept for a while: the source of /debug/pprof/profile and
// the flame graph page. Storage only: the tracer adds a batch each time its kernel maps are
// read (every drain, and when a reader asks for a fresh cut through Profiles); a reader asks
// for the batches of a time window. Bounded: batches older than the retention go, and the
// frame and stack tables are compacted to what the kept batches use. It has its own lock; the
// metric store's is never taken.

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/profile/slow_events.h"  // kDefaultRetention
#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

enum class SampleKind : std::uint8_t { OnCpu, OffCpu };

struct Sample {
  std::uint32_t pid = 0;
  std::uint32_t tid = 0;
  std::string comm;
  CgroupLabel workload;  // empty cgroup when `cgroup` is off
  SampleKind kind = SampleKind::OnCpu;
  std::int32_t syscall = -1;  // the system call a wait was in (x86-64 number), -1: none
  std::uint64_t count = 0;    // samples, or waits
  std::uint64_t ns = 0;       // CPU time, or time blocked
  // A wait that began before the batch it is added with: when it began and ended (for
  // several waits of one system call, the first began and the last ended). The store keeps
  // it whole in the batch it came with; a window gets the part of `ns` that falls in it, in
  // proportion to its share of the span, and `count` where the batch is in the window. The
  // epoch (the default): the sample is within its batch. Windows' samples are all so.
  std::chrono::steady_clock::time_point began{}, ended{};
  // Which stack: an index into the stacks given with the sample to add_batch, and in a
  // ProfileWindow into its `stacks`.
  std::uint32_t stack = 0;
};

// A stack as add_viewed_batch takes it: its frames, innermost first, in two parts that follow
// each other (the kernel's, then the user's), each viewing frames its caller keeps until
// add_viewed_batch returns: a caller's cached frames are read, not copied.
struct StackView {
  std::array<std::span<const Frame>, 2> parts;
};

// The monotonic clock, which bpf_ktime_get_ns() reads too.
using Clock = std::chrono::steady_clock;

// The scheduler's own accounting of a thread over a batch (or a window): the time it ran on
// a CPU and the time it was runnable but waited for one, exact to the nanosecond (not
// sampled).
struct ThreadTime {
  std::uint32_t pid = 0;
  std::uint32_t tid = 0;
  std::string comm;
  CgroupLabel workload;
  std::uint64_t on_cpu_ns = 0;
  std::uint64_t run_delay_ns = 0;
};

// The samples of one window, with the frames their stacks use: a copy, read without locks.
struct ProfileWindow {
  Clock::time_point begin, end;
  std::chrono::system_clock::time_point wall_begin;
  // Where what the store kept began when the window was read: a window asked for from
  // earlier holds less than was asked.
  std::chrono::system_clock::time_point wall_kept_from;
  std::chrono::seconds kept_for{};  // the store's retention
  std::uint32_t frequency = 0;      // on-CPU samples per second and CPU
  std::vector<Sample> samples;
  std::vector<std::vector<std::uint32_t>> stacks;  // by stack id: frame ids
  std::vector<Frame> frames;                       // by frame id
  // The threads' accounting in the window, by thread, those the filter keeps; `accounted`:
  // every batch of the window had it (the kernel side could report it).
  std::vector<ThreadTime> threads;
  bool accounted = false;
};

// Which samples (or slow events) a reader wants: those of one process, one thread, one
// command name (the kernel's, at most 15 characters) and one workload (the `cgroup` label, a
// systemd unit or a path below the cgroup2 mount), each when given.
struct SampleFilter {
  std::optional<std::uint32_t> pid, tid;
  std::optional<std::string> comm, workload;
  template <class T>
  bool matches(const T& s) const {
    return (!pid || s.pid == *pid) && (!tid || s.tid == *tid) && (!comm || s.comm == *comm) &&
           (!workload || s.workload.cgroup == *workload);
  }
};

class ProfileStore {
 public:
  // The config's `profiles` section: how long samples are kept, and at most how many (the
  // memory budget: the oldest batches go first past it).
  struct Limits {
    std::chrono::seconds retention = kDefaultRetention;
    std::size_t max_samples = 100000;  // over all kept batches
  };
  explicit ProfileStore(Limits limits) : limits_(limits) {}
  ProfileStore() : ProfileStore(Limits{}) {}
  // New limits (a reload): what is held stays, unless older than the new retention or past
  // the new budget.
  void set_limits(Limits limits);
  Limits limits() const;

  // --- for the profile tracer
  // Adds what happened from the end of the previous batch to `end`: samples whose `stack`
  // indexes `stacks` (each innermost frame first). Samples beyond max_samples are not kept
  // and counted (dropped_samples()). A wait that began before (Sample::began) is kept
  // whole, once: windows take their part of it (window()).
  // `threads`: the threads' accounting over the batch (nullopt: none could be had), each
  // entry kept as a sample is against max_samples. `waiting`: the waits in progress at
  // `end` (Sample::began when each began, ended when it was seen, count 0), indexing
  // `stacks` too; they replace the previous batch's, and windows take their part of them
  // as of waits that ended then.
  void add_batch(Clock::time_point end, std::vector<Sample> samples,
                 const std::vector<std::vector<Frame>>& stacks,
                 std::optional<std::vector<ThreadTime>> threads = std::nullopt,
                 std::vector<Sample> waiting = {});
  // The same with each stack's frames viewed in parts (StackView), not copied.
  void add_viewed_batch(Clock::time_point end, std::vector<Sample> samples,
                        const std::vector<StackView>& stacks,
                        std::optional<std::vector<ThreadTime>> threads = std::nullopt,
                        std::vector<Sample> waiting = {});
  // The on-CPU sampling rate, for the windows' period.
  void set_frequency(std::uint32_t hz) { frequency_ = hz; }

  // --- for readers
  // The samples of batches that ended after `from` and by `to` that `filter` keeps, with
  // the stacks and frames they use. A wait that spans the window's edges brings only its
  // part within them, so no window holds more off-CPU time than its threads lasted.
  ProfileWindow window(Clock::time_point from, Clock::time_point to,
                       const SampleFilter& filter = {}) const;

  std::size_t samples_kept() const;
  std::size_t frames_kept() const;
  // The memory of what is kept, by part: samples (with the threads' accounting and who
  // they were), the stack table, and the frames with their names.
  struct Bytes {
    std::size_t samples = 0, stacks = 0, frames = 0;
  };
  Bytes bytes() const;
  std::uint64_t dropped_samples() const;

 private:
  // A sample as kept: its command name and workload an index into whos_ (a few distinct
  // ones among many samples), its stack into stacks_.
  struct Kept {
    std::uint32_t pid = 0, tid = 0;
    std::uint32_t who = 0;
    std::uint32_t stack = 0;
    std::int32_t syscall = -1;
    SampleKind kind = SampleKind::OnCpu;
    std::uint64_t count = 0, ns = 0;
    Clock::time_point began{}, ended{};
  };
  struct Who {
    std::string comm;
    CgroupLabel workload;
  };
  struct KeptTime {
    std::uint32_t pid = 0, tid = 0;
    std::uint32_t who = 0;
    std::uint64_t on_cpu_ns = 0, run_delay_ns = 0;
  };
  struct Batch {
    Clock::time_point begin, end;
    std::vector<Kept> samples;
    std::vector<KeptTime> threads;
    bool accounted = false;
  };
  std::uint32_t intern(const StackView& stack);  // caller holds mutex_
  // A stack of frame ids: its id, the same for the same frames (caller holds mutex_).
  std::uint32_t intern_ids(std::vector<std::uint32_t> ids);
  // caller holds mutex_
  std::uint32_t intern_who(const std::string& comm, const CgroupLabel& workload);
  Kept keep(const Sample& s, std::uint32_t stack);  // caller holds mutex_
  Sample unpack(const Kept& k) const;               // caller holds mutex_
  void expire(Clock::time_point now);               // caller holds mutex_
  void compact();                                   // caller holds mutex_

  Limits limits_;
  std::atomic<std::uint32_t> frequency_{0};
  mutable std::mutex mutex_;
  std::deque<Batch> batches_;
  std::vector<Kept> waiting_;  // the waits in progress at the newest batch's end
  Clock::time_point last_end_ = Clock::now();
  std::size_t samples_ = 0;
  std::uint64_t dropped_ = 0;
  // A frame as kept: its function, file and build ID as ids of names_, each text kept once
  // however many frames share it (200 programs' frames share their function names; a
  // program's thousand frames, its file's name and build ID).
  struct KeptFrame {
    std::uint64_t address = 0;
    std::uint32_t function = 0, module = 0, build_id = 0;
    bool kernel = false;
    std::vector<SourceLine> lines;
    bool operator==(const KeptFrame&) const = default;
  };
  std::uint32_t intern_name(const std::string& text);  // caller holds mutex_
  KeptFrame keep_frame(const Frame& f);                // caller holds mutex_
  Frame unpack_frame(const KeptFrame& f) const;        // caller holds mutex_
  // Each frame and stack once, by id; the sets index them by content (ids, hashed and
  // compared through the tables).
  // Transparent: a frame is looked up by its content before it is copied in.
  struct FrameIdHash {
    using is_transparent = void;
    const std::vector<KeptFrame>* frames;
    std::size_t operator()(std::uint32_t id) const { return (*this)((*frames)[id]); }
    std::size_t operator()(const KeptFrame& f) const;
  };
  struct FrameIdEq {
    using is_transparent = void;
    const std::vector<KeptFrame>* frames;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return (*frames)[a] == (*frames)[b]; }
    bool operator()(const KeptFrame& a, std::uint32_t b) const { return a == (*frames)[b]; }
    bool operator()(std::uint32_t a, const KeptFrame& b) const { return (*frames)[a] == b; }
  };
  struct StackIdHash {
    const std::vector<std::vector<std::uint32_t>>* stacks;
    std::size_t operator()(std::uint32_t id) const;
  };
  struct StackIdEq {
    const std::vector<std::vector<std::uint32_t>>* stacks;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return (*stacks)[a] == (*stacks)[b]; }
  };
  std::vector<Who> whos_;
  std::unordered_map<std::string, std::uint32_t> who_ids_;  // by comm and labels, joined
  // The names frames use, by id (pointers to name_ids_' keys, which stay where they are).
  std::vector<const std::string*> names_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::size_t names_heap_ = 0;  // the names' text past their strings' inline buffers
  std::vector<KeptFrame> frames_;
  std::size_t frames_heap_ = 0;  // the lines of frames_, kept as they change
  std::unordered_set<std::uint32_t, FrameIdHash, FrameIdEq> frame_ids_{0, FrameIdHash{&frames_},
                                                                       FrameIdEq{&frames_}};
  std::vector<std::vector<std::uint32_t>> stacks_;
  std::size_t stacks_heap_ = 0;  // the ids' arrays of stacks_, kept as they change
  std::unordered_set<std::uint32_t, StackIdHash, StackIdEq> stack_ids_{0, StackIdHash{&stacks_},
                                                                       StackIdEq{&stacks_}};
};

}  // namespace ebpf_metricsd::profiling
