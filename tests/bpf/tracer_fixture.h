#pragma once
// Building a tracer the way the daemon does (config text -> descriptor -> tracer).

#include <bpf/libbpf.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../metrics_lookup.h"
#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/bpf/host_safety.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/metrics/exposition_format.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/tracers/registry.h"

namespace ebpf_metricsd::test {

// The hook `auto` must choose for a tracer whose tp_btf programs keep per-thread state in
// task storage: tp_btf where the kernel has that map type (5.11+) and may create it in a
// tracepoint (not on PREEMPT_RT before 6.4: docs/host-safety.md), else raw_tp, whose programs
// keep it in a pid-keyed hash.
inline std::string auto_hook_with_task_storage() {
  if (!kernel_allocators().storage_in_tracepoints()) return "raw_tp";
  return libbpf_probe_bpf_map_type(BPF_MAP_TYPE_TASK_STORAGE, nullptr) == 1 ? "tp_btf" : "raw_tp";
}
// The scheduler tracers create task storage on scheduler hooks: only where the kernel's task
// storage has the BPF memory allocator (docs/host-safety.md), raw_tp elsewhere.
inline std::string auto_hook_for_scheduler() {
  return kernel_allocators().task_storage ? auto_hook_with_task_storage() : "raw_tp";
}

// A started tracer with the scope its metrics live in (declared first: outlives it).
struct StartedTracer {
  std::unique_ptr<MetricScope> scope;
  std::unique_ptr<Tracer> tracer;
  StartedTracer() = default;
  StartedTracer(StartedTracer&&) = default;
  // The tracer goes before the scope it declared its metrics in.
  StartedTracer& operator=(StartedTracer&& other) noexcept {
    tracer.reset();
    scope = std::move(other.scope);
    tracer = std::move(other.tracer);
    return *this;
  }
  ~StartedTracer() { tracer.reset(); }
  Tracer* operator->() const { return tracer.get(); }
  Tracer& operator*() const { return *tracer; }
};

// The walk of user stacks in the kernel every tracer of the test process shares, as the
// daemon's tracers share the daemon's (its maps made when the first tracer that walks starts).
inline profiling::Walker& test_walker() {
  static profiling::Walker walker;
  return walker;
}

// Builds and starts tracer `name` as the daemon does (build_tracer), with the YAML option
// lines `options` (each indented by four spaces, e.g. "    hook: raw_tp\n").
// `profiles`: where the profile tracer keeps its stacks.
// `walker`: the walk's maps and processes (default: test_walker()).
inline StartedTracer start_tracer(MetricStore& store, const std::string& name,
                                  const std::string& options = "",
                                  profiling::Profiles* profiles = nullptr,
                                  profiling::Walker* walker = nullptr) {
  const Config cfg =
      parse_config("tracers:\n  " + name + ":\n    enabled: true\n" + options, "test.yaml");
  for (const auto& tc : cfg.tracers) {
    if (tc.name != name) continue;
    StartedTracer t;
    t.scope = std::make_unique<MetricScope>(store, name);
    KernelHookProber prober;
    t.tracer = build_tracer(tc, *t.scope, prober,
                            TracerContext{profiles, walker ? walker : &test_walker()});
    return t;
  }
  throw std::runtime_error("tracer " + name + " is not registered");
}

// `tracer`'s drops of `reason` so far, as counted in the store
// (ebpf_metricsd_dropped_events_total).
inline double dropped_events(const MetricStore& store, const std::string& tracer,
                             const std::string& reason) {
  return counter_value(store, "ebpf_metricsd_dropped_events_total",
                       {{"tracer", tracer}, {"reason", reason}});
}
// What the kernel skipped of `tracer`'s programs so far: runs that would have re-entered a
// program on a CPU (a task preempted inside it, or an NMI).
inline double recursion_misses(const MetricStore& store, const std::string& tracer) {
  return dropped_events(store, tracer, "recursion");
}
// What `tracer`'s kernel side counted as not done since this was made: runs the kernel
// skipped (recursion_misses) and events it found no room for ("map_full": a thread's stamp
// or a histogram an atomic allocation could not make). A count of events the test made is
// exact when seen <= made <= seen + total().
class CountedLosses {
 public:
  CountedLosses(const MetricStore& store, std::string tracer)
      : store_(store), tracer_(std::move(tracer)), recursion0_(recursion()), no_room0_(no_room()) {}
  std::uint64_t total() const {
    return static_cast<std::uint64_t>(recursion() - recursion0_ + no_room() - no_room0_);
  }
  std::string text() const {
    return "recursion misses " + std::to_string(recursion() - recursion0_) +
           ", drops for want of room " + std::to_string(no_room() - no_room0_);
  }

 private:
  double recursion() const { return recursion_misses(store_, tracer_); }
  double no_room() const { return dropped_events(store_, tracer_, "map_full"); }
  const MetricStore& store_;
  std::string tracer_;
  double recursion0_, no_room0_;
};
// The slow events of `tracer` sent with the stacks from their start in place of being held
// for their system call's return (common/slow_return.bpf.h), each counted under a
// slow_return_* reason: their sum, and the counts as text in `text`.
inline double slow_not_held(const MetricStore& store, const std::string& tracer,
                            std::string& text) {
  double sum = 0;
  for (const char* reason : {"slow_return_second", "slow_return_full", "slow_return_exited",
                             "slow_return_exec", "slow_return_late", "slow_return_mismatch"}) {
    const double n = dropped_events(store, tracer, reason);
    sum += n;
    text += std::string(" ") + reason + "=" + std::to_string(static_cast<long>(n));
  }
  return sum;
}
// offcpu_time's count of waits whose end no program saw (README: wake_missed).
inline double wake_missed(const MetricStore& store) {
  return dropped_events(store, "offcpu_time", "wake_missed");
}

// The two scheduler tracers from one config, as the daemon starts them (each its own object).
// `runq` and `offcpu`: each one's option lines.
struct SchedulerTracers {
  StartedTracer runq, offcpu;
};
inline SchedulerTracers start_scheduler_tracers(MetricStore& store, const std::string& runq,
                                                const std::string& offcpu,
                                                profiling::Profiles* profiles = nullptr) {
  const Config cfg = parse_config("tracers:\n  runqueue_latency:\n    enabled: true\n" + runq +
                                      "  offcpu_time:\n    enabled: true\n" + offcpu,
                                  "test.yaml");
  SchedulerTracers both;
  KernelHookProber prober;
  for (const auto& tc : cfg.tracers) {
    StartedTracer* t = tc.name == "runqueue_latency" ? &both.runq
                       : tc.name == "offcpu_time"    ? &both.offcpu
                                                     : nullptr;
    if (!t) continue;
    t->scope = std::make_unique<MetricScope>(store, tc.name);
    t->tracer = build_tracer(tc, *t->scope, prober, TracerContext{profiles});
  }
  return both;
}

// The slow events of histogram `metric` kept in `profiles` that `wanted` picks (given the
// event and the window it was found in, which holds its stack), once there are `n` of them,
// with that window: they come through a ring buffer, so the tracer is drained every 100 ms
// until they are in, for at most a minute (fewer are returned then).
struct SlowFound {
  std::vector<profiling::SlowEvent> events;
  profiling::SlowWindow window;
};
inline SlowFound wait_for_slow(
    const StartedTracer& tracer, profiling::Profiles& profiles, const std::string& metric,
    std::size_t n,
    const std::function<bool(const profiling::SlowEvent&, const profiling::SlowWindow&)>& wanted) {
  profiling::SlowEventStore::Query q;
  q.metric = metric;
  SlowFound found;
  // Up to a minute: a guest emulated on a busy host takes seconds for what takes
  // milliseconds here.
  for (int i = 0; i < 600 && found.events.size() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    tracer->drain();
    found.events.clear();
    found.window = profiles.slow_events().query(q);
    for (const auto& e : found.window.events) {
      if (wanted(e, found.window)) found.events.push_back(e);
    }
  }
  return found;
}
inline std::vector<profiling::SlowEvent> wait_for_slow_events(
    const StartedTracer& tracer, profiling::Profiles& profiles, const std::string& metric,
    std::size_t n, const std::function<bool(const profiling::SlowEvent&)>& wanted) {
  return wait_for_slow(
             tracer, profiles, metric, n,
             [&](const profiling::SlowEvent& e, const profiling::SlowWindow&) { return wanted(e); })
      .events;
}

// Checks that `tracer` counted nothing under any of `reasons` in
// ebpf_metricsd_dropped_events_total, as collected in `fams`.
template <class Families>
void check_no_drops(const Families& fams, const std::string& tracer,
                    const std::vector<std::string>& reasons) {
  for (const auto& reason : reasons) {
    INFO(tracer << " dropped " << reason);
    const auto* d = find_series(fams, "ebpf_metricsd_dropped_events_total",
                                {{"tracer", tracer}, {"reason", reason}});
    CHECK((d == nullptr || d->counter.value == 0));
  }
}

// The user frames' functions of a kept slow event's stack, innermost first.
inline std::vector<std::string> user_functions(const profiling::SlowEvent& e,
                                               const profiling::SlowWindow& w) {
  std::vector<std::string> user;
  if (auto it = w.stacks.find(e.stack_id); it != w.stacks.end()) {
    for (const auto& f : it->second) {
      if (!f.kernel) user.push_back(f.function);
    }
  }
  return user;
}
// The `result` label values of the walks' counts (ebpf_metricsd_profile_unwinds_total,
// ebpf_metricsd_slow_unwinds_total): every end of a walk (bpf/common/unwind.h).
inline std::vector<std::string> walk_ends() {
  std::vector<std::string> out;
  for (std::uint32_t e = 0; e < EMD_UNWIND_END__COUNT; ++e)
    out.emplace_back(profiling::walk_end_name(e));
  return out;
}

// "a <- b <- c": a stack's functions, innermost first, for messages.
inline std::string chain_text(const std::vector<std::string>& functions) {
  std::string chain;
  for (const auto& f : functions) chain += (chain.empty() ? "" : " <- ") + f;
  return chain;
}
// Whether `functions` (innermost first) hold each of `callees_first` in that order.
inline bool holds_in_order(const std::vector<std::string>& functions,
                           const std::vector<std::string>& callees_first) {
  auto at = functions.begin();
  for (const auto& name : callees_first) {
    at = std::find(at, functions.end(), name);
    if (at == functions.end()) return false;
  }
  return true;
}

// The user frames of stack `stack` in window `w`, leaf first (the last is the cut's mark of a
// walk cut short).
inline std::vector<const profiling::Frame*> user_frames(const profiling::ProfileWindow& w,
                                                        std::uint32_t stack) {
  std::vector<const profiling::Frame*> frames;
  for (std::uint32_t f : w.stacks[stack]) {
    if (!w.frames[f].kernel) frames.push_back(&w.frames[f]);
  }
  return frames;
}

// Whether the profile in `store` holds, since `from`, a sample of process `pid` whose user
// frames (leaf first) satisfy `holds`.
inline bool sampled(profiling::Profiles& store, pid_t pid, profiling::Clock::time_point from,
                    const std::function<bool(const std::vector<const profiling::Frame*>&)>& holds) {
  const profiling::ProfileWindow w = store.store().window(from, profiling::Clock::now());
  for (const auto& s : w.samples) {
    if (s.pid == static_cast<std::uint32_t>(pid) && holds(user_frames(w, s.stack))) return true;
  }
  return false;
}

// Whether a frame of `frames` is in `function`.
inline bool has_frame(const std::vector<const profiling::Frame*>& frames,
                      const std::string& function) {
  return std::any_of(frames.begin(), frames.end(),
                     [&](const profiling::Frame* f) { return f->function == function; });
}

// Whether the profile in `store` holds, since `from`, a sample of process `pid` in
// `function` (warm_up(), by default) whose stack reaches main: the walk in the kernel has its
// mappings and its files' tables.
inline bool walked_to_main(profiling::Profiles& store, pid_t pid, profiling::Clock::time_point from,
                           const std::string& function = "warm_up") {
  return sampled(store, pid, from, [&](const std::vector<const profiling::Frame*>& frames) {
    return has_frame(frames, function) && has_frame(frames, "main");
  });
}

// Whether a walk of gated workload `pid` went as far as it can: walked_to_main, or a test's
// own judgement.
using WalkedEnough = std::function<bool(profiling::Profiles&, pid_t, profiling::Clock::time_point)>;

// Opens the gate of gated workload `pid` (SIGUSR1) once the profile in `store` has walked
// it to main (or as far as `walked_enough` asks), for at most two minutes (an emulated guest on a
// busy host reads a new process late).
inline void open_when_walked(profiling::Profiles& store, pid_t pid,
                             profiling::Clock::time_point from,
                             const WalkedEnough& walked_enough = {}) {
  bool walked = false;
  for (int i = 0; i < 1200 && !walked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(store.cut());
    walked = walked_enough ? walked_enough(store, pid, from) : walked_to_main(store, pid, from);
  }
  INFO("no walk of the gated workload " << pid << " went as far as it can");
  REQUIRE(walked);
  REQUIRE(kill(pid, SIGUSR1) == 0);
}

// The same for a test of tracers that walk events, not samples (slow events): a profile of
// its own, at 997 Hz on-CPU, walks the workload's warm_up() with the same maps
// (test_walker()), and is stopped once the gate is open.
inline void open_when_walked(pid_t pid) {
  MetricStore metrics;
  profiling::Profiles store;
  auto profile =
      start_tracer(metrics, "profile", "    frequency: 997\n    off_cpu: false\n", &store);
  REQUIRE(store.cut());
  open_when_walked(store, pid, profiling::Clock::now() - std::chrono::seconds(1));
}

// The environment of a gated workload (PROFILE_WORKLOAD_GATE: it spins in warm_up() until
// SIGUSR1, tests/profile_workload/): this process's, and the gate.
inline std::vector<char*> gated_environment() {
  static std::string gate = "PROFILE_WORKLOAD_GATE=1";
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(gate.data());
  env.push_back(nullptr);
  return env;
}

// The builds of a workload that a slow-event test runs: with frame pointers and without (as
// Debian builds), or, where EBPF_METRICSD_ONE_WORKLOAD_BUILD is set (the kernel matrix's
// emulated guests), the one without alone. Both run the same programs over the same kernel
// events (the walk reads either's table); what differs is in user space, and both run on the
// host.
inline std::vector<std::string> workload_builds(const char* frame_pointers, const char* without) {
  if (std::getenv("EBPF_METRICSD_ONE_WORKLOAD_BUILD")) return {without};
  return {frame_pointers, without};
}

// A workload program run with `args` that stays until finish() closes its standard input
// (the io_workload's convention), or exits by itself.
class SpawnedWorkload {
 public:
  enum class Gate {
    None,
    // It waits at its gate (gated_environment) until open_when_walked() lets it go, here.
    WhenWalked,
    // It waits at each of its gates until the caller signals it (SIGUSR1); killed when it is
    // destroyed unfinished (a failed check leaves nothing spinning).
    Caller,
  };
  enum class Output { Discarded, Piped };
  explicit SpawnedWorkload(std::vector<std::string> args, bool gated = false)
      : SpawnedWorkload(std::move(args), gated ? Gate::WhenWalked : Gate::None, Output::Discarded) {
  }
  SpawnedWorkload(std::vector<std::string> args, Gate gate, Output output) : gate_(gate) {
    int in[2], out[2] = {-1, -1};
    REQUIRE(pipe2(in, O_CLOEXEC) == 0);
    stdin_ = in[1];
    if (output == Output::Piped && pipe2(out, O_CLOEXEC) != 0) {
      close(in[0]);
      close(std::exchange(stdin_, -1));
      FAIL("pipe2: " << std::strerror(errno));
    }
    if (out[0] >= 0) output_ = fdopen(out[0], "r");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    if (output == Output::Piped) {
      posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    }
    const bool gated = gate != Gate::None;
    std::vector<char*> env = gated ? gated_environment() : std::vector<char*>{};
    const int err =
        posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), gated ? env.data() : environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    if (out[1] >= 0) close(out[1]);
    if (err != 0) pid_ = 0;
    if (err != 0 || (output == Output::Piped && !output_)) {
      release();
      FAIL("spawning " << args[0] << ": " << std::strerror(err ? err : errno));
    }
    if (gate == Gate::WhenWalked) {
      // A failed check there leaves no workload spinning at its gate: the constructor does not
      // finish, so no destructor would kill it.
      try {
        open_when_walked(pid_);
      } catch (...) {
        kill(pid_, SIGKILL);
        release();
        throw;
      }
    }
  }
  // A workload gated by the caller and not finished is killed (a failed check leaves nothing
  // spinning at its gate); its output is closed first, so one blocked writing to a full pipe
  // ends too.
  ~SpawnedWorkload() {
    if (gate_ == Gate::Caller && pid_ > 0) kill(pid_, SIGKILL);
    release();
  }
  SpawnedWorkload(const SpawnedWorkload&) = delete;
  SpawnedWorkload& operator=(const SpawnedWorkload&) = delete;
  pid_t pid() const { return pid_; }
  // Its standard output, with Output::Piped (nullptr otherwise).
  FILE* output() const { return output_; }
  // Its exit status (-1: it did not exit normally), and what it used into `usage` if given.
  int finish(rusage* usage = nullptr) {
    if (stdin_ >= 0) close(std::exchange(stdin_, -1));
    if (pid_ > 0) {
      int status = 0;
      wait4(std::exchange(pid_, 0), &status, 0, usage);
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return status_;
  }

 private:
  // Closes its pipes and waits for it.
  void release() {
    if (output_) fclose(std::exchange(output_, nullptr));
    finish();
  }

  Gate gate_;
  pid_t pid_ = 0;
  int stdin_ = -1;
  int status_ = -1;
  FILE* output_ = nullptr;
};

// The bucket `last` (a kept slow event) was counted in (the first le at or above its latency)
// carries the newest event of `window` in that series and bucket as its exemplar, in the
// OpenMetrics text of `store`: on the line that begins with `bucket_labels` (the metric's
// `_bucket{` and the series' labels before le).
inline void check_bucket_exemplar(const MetricStore& store, const profiling::SlowWindow& window,
                                  const profiling::SlowEvent& last,
                                  const std::string& bucket_labels) {
  const auto le_of = [](std::uint64_t ns) {
    return format_double(std::exp2(std::ceil(std::log2(static_cast<double>(ns) * 1e-9))));
  };
  const std::string le = le_of(last.latency_ns);
  const profiling::SlowEvent* newest = nullptr;
  for (const auto& e : window.events) {
    if (e.series == last.series && le_of(e.latency_ns) == le &&
        (!newest || e.when >= newest->when)) {
      newest = &e;
    }
  }
  REQUIRE(newest != nullptr);
  const std::string om = render_openmetrics(store);
  const std::string line = bucket_labels + "le=\"" + le + "\"} ";
  const auto at = om.find(line);
  INFO(line);
  INFO(om.substr(0, 3000));
  REQUIRE(at != std::string::npos);
  const std::string bucket = om.substr(at, om.find('\n', at) - at);
  CHECK_THAT(bucket, Catch::Matchers::Contains(
                         "# {stack_id=\"" + profiling::stack_id_text(newest->stack_id) +
                         "\",pid=\"" + std::to_string(newest->pid) + "\",comm=\""));
}

}  // namespace ebpf_metricsd::test
