// The profile tracer on the real kernel, against a known workload the test runs
// (tests/profile_workload): CPU time split 3:1 between two functions, and a thread blocked
// in a known function for a time it measures itself.
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../cgroup_fixture.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/profile/pprof.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "profile.pb.h"
#include "sample_oracle.skel.h"
#include "tracer_fixture.h"

extern char** environ;

using namespace ebpf_metricsd;
using profiling::Frame;
using profiling::ProfileWindow;
using profiling::Sample;
using profiling::SampleKind;

namespace {

// The sampling frequency of these tests: 997 Hz (a prime), about two thousand samples of the
// workload's two seconds of CPU. Where every instruction runs emulated (the kernel matrix's
// guests, EBPF_METRICSD_PROFILE_TEST_HZ), fewer: unwinding a copied stack costs 20 to 50
// times more there, and the unwinder must keep up with the samples for them to reach main.
std::uint32_t test_hz() {
  const char* hz = std::getenv("EBPF_METRICSD_PROFILE_TEST_HZ");
  return hz ? static_cast<std::uint32_t>(std::atoi(hz)) : 997;
}
double ratio(std::uint64_t part, std::uint64_t whole) {
  return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

std::string frequency_option() { return "    frequency: " + std::to_string(test_hz()) + "\n"; }

// CPU time of hot_three + hot_one (at 997 Hz about 2,000 samples, fewer where the host starves
// a guest's CPU: the oracle below counts them), and reads of 20 ms.
constexpr int kCpuMs = 2000;
constexpr int kReads = 25;

struct WorkloadRun {
  pid_t pid = 0;
  long long blocked_ns = 0;      // the reader's time off the CPU in read()
  long long cond_ns = 0;         // the waiter's in pthread_cond_wait()
  long long cpu_ns = 0;          // its CPU time, user and system, as the kernel accounted it
  long long threads_cpu_ns = 0;  // its threads' own CPU clocks, each read as the thread ended
};

// Counts the CPU-clock samples its own perf events take of one process, at `frequency`.
class SampleOracle {
 public:
  explicit SampleOracle(std::uint32_t frequency) : skel_(sample_oracle__open_and_load()) {
    REQUIRE(skel_);
    perf_event_attr attr{};
    attr.type = PERF_TYPE_SOFTWARE;
    attr.size = sizeof attr;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.freq = 1;
    attr.sample_freq = frequency;
    for (int cpu : online_cpus())
      links_.push_back(attach_perf_event(skel_->progs.oracle_sample, attr, cpu));
  }
  ~SampleOracle() {
    links_.clear();
    sample_oracle__destroy(skel_);
  }
  void target(pid_t pid) { skel_->bss->target_tgid = static_cast<std::uint32_t>(pid); }
  std::uint64_t samples() const { return __atomic_load_n(&skel_->bss->samples, __ATOMIC_SEQ_CST); }

 private:
  sample_oracle* skel_;
  std::vector<BpfLink> links_;
};

// Runs the workload to its end. `while_held`, if given, runs once the workload has done its
// work and printed what it measured, while its process still lives ("hold"): a profile cut
// there names its stacks from mappings that can still be read, however late a starved host
// read them after the process was announced. `gate`, if given, starts it gated
// (PROFILE_WORKLOAD_GATE: it spins in warm_up) and is called with its pid, to open the gate
// (SIGUSR1) when it will.
WorkloadRun run_workload(const std::string& binary, SampleOracle* oracle = nullptr,
                         const std::function<void()>& while_held = {},
                         const std::function<void(pid_t)>& gate = {}, int cpu_ms = kCpuMs,
                         int reads_wanted = kReads) {
  std::vector<std::string> args = {binary, std::to_string(cpu_ms), std::to_string(reads_wanted)};
  if (while_held) args.emplace_back("hold");
  using Gate = test::SpawnedWorkload::Gate;
  test::SpawnedWorkload workload(std::move(args), gate ? Gate::Caller : Gate::None,
                                 test::SpawnedWorkload::Output::Piped);
  WorkloadRun run;
  run.pid = workload.pid();
  if (oracle) oracle->target(run.pid);
  if (gate) gate(run.pid);
  std::string text;
  char buf[256];
  // Its last line says it is done (and holds, if asked to).
  const std::regex done(R"(threads_cpu_ns \d+\n)");
  while (!std::regex_search(text, done) && fgets(buf, sizeof buf, workload.output())) text += buf;
  if (while_held) while_held();
  rusage usage{};
  REQUIRE(workload.finish(&usage) == 0);
  run.cpu_ns = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL +
               (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL;
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(R"(blocked_ns (\d+)\ncond_ns (\d+)\n)")));
  run.blocked_ns = std::stoll(m[1]);
  run.cond_ns = std::stoll(m[2]);
  REQUIRE(std::regex_search(text, m, std::regex(R"(threads_cpu_ns (\d+)\n)")));
  run.threads_cpu_ns = std::stoll(m[1]);
  return run;
}

// The first user frame of a stack (innermost first), or nullptr.
bool has_function(const ProfileWindow& w, std::uint32_t stack, const std::string& name,
                  bool kernel) {
  for (std::uint32_t f : w.stacks[stack]) {
    if (w.frames[f].kernel == kernel && w.frames[f].function == name) return true;
  }
  return false;
}

// pipe_read, or anon_pipe_read since 6.14.
bool has_function_containing(const ProfileWindow& w, std::uint32_t stack, const std::string& part,
                             bool kernel) {
  for (std::uint32_t f : w.stacks[stack]) {
    if (w.frames[f].kernel == kernel && w.frames[f].function.find(part) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// Whether process `pid` is asleep inside read() (system call 0), as /proc reports it.
bool asleep_in_read(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream stat(proc + "/stat"), call(proc + "/syscall");
  const std::string text((std::istreambuf_iterator<char>(stat)), {});
  std::string nr;
  call >> nr;
  const auto paren = text.rfind(')');
  return paren != std::string::npos && text.compare(paren + 1, 3, " S ") == 0 && nr == "0";
}

// Where a stack ends: innermost first, its outermost user frame.
bool reaches(const ProfileWindow& w, std::uint32_t stack, const std::string& root) {
  return has_function(w, stack, root, false);
}

// A set of stacks: samples (or waits) and those of them that reach their root.
struct Share {
  std::uint64_t count = 0, reaching = 0, ns = 0, ns_reaching = 0;
  void add(const Sample& s, bool reached) {
    count += s.count;
    ns += s.ns;
    if (reached) {
      reaching += s.count;
      ns_reaching += s.ns;
    }
  }
};

struct Observed {
  std::string stacks;         // the workload's heaviest stacks, for messages
  std::string other_waits;    // off-CPU stacks of the workload in neither wait function
  std::uint64_t on_cpu = 0;   // on-CPU samples
  std::uint64_t warm_up = 0;  // ... of them in warm_up(), before the gate opened
  // On-CPU samples with that leaf (the innermost user frame), and of them those whose
  // stack reaches main.
  Share three, one, compare;
  // Off-CPU waits in wait_on_pipe (through read()) and in wait_for_signal (through
  // pthread_cond_wait()), reaching their thread's start routine.
  Share waits, cond_waits;
  std::uint64_t waits_with_pipe_read = 0;  // ... with pipe_read among the kernel frames
  std::uint64_t waits_named_read = 0;      // ... with read() as their syscall
  std::string first_kernel_frame;          // of a wait
  std::string comm;
};

Observed observe(const ProfileWindow& w, pid_t pid) {
  Observed o;
  {
    std::map<std::string, std::uint64_t> by;
    for (const auto& s : w.samples) by[s.comm + "/" + std::to_string(s.pid)] += s.count;
    o.stacks += "\n  window: " + std::to_string(w.samples.size()) + " aggregates; workload " +
                std::to_string(pid) + ";";
    for (const auto& [k, n] : by) o.stacks += " " + k + "=" + std::to_string(n);
  }
  std::multimap<std::uint64_t, std::string, std::greater<>> heaviest;
  for (const auto& s : w.samples) {
    if (s.pid != static_cast<std::uint32_t>(pid)) continue;
    std::string names;
    for (std::uint32_t f : w.stacks[s.stack]) names += " " + w.frames[f].function;
    heaviest.emplace(s.count, (s.kind == SampleKind::OnCpu ? "on-CPU" : "off-CPU") + names);
    if (s.kind == SampleKind::OnCpu) {
      o.on_cpu += s.count;
      const auto user = test::user_frames(w, s.stack);
      if (user.empty()) continue;
      const Frame* leaf = user.front();
      const bool main = reaches(w, s.stack, "main");
      if (leaf->function == "hot_three") o.three.add(s, main);
      if (leaf->function == "hot_one") o.one.add(s, main);
      if (leaf->function == "compare_slowly") o.compare.add(s, main);
      if (leaf->function == "warm_up") o.warm_up += s.count;
      continue;
    }
    if (has_function(w, s.stack, "wait_on_pipe", false)) {
      o.waits.add(s, reaches(w, s.stack, "reader"));
      o.comm = s.comm;
      if (has_function_containing(w, s.stack, "pipe_read", true)) o.waits_with_pipe_read += s.count;
      if (s.syscall == 0) o.waits_named_read += s.count;  // x86-64 read
      const auto& frames = w.stacks[s.stack];
      if (!frames.empty() && w.frames[frames.front()].kernel) {
        o.first_kernel_frame = w.frames[frames.front()].function;
      }
    } else if (has_function(w, s.stack, "wait_for_signal", false)) {
      o.cond_waits.add(s, reaches(w, s.stack, "waiter"));
    } else {
      // Any other off-CPU stack of the workload: where a wait not found above went.
      o.other_waits += "\n    " + std::to_string(s.count) + " tid " + std::to_string(s.tid) +
                       " syscall " + std::to_string(s.syscall) + ":" + names.substr(0, 300);
    }
  }
  if (!o.other_waits.empty()) o.stacks += "\n  other off-CPU stacks:" + o.other_waits;
  int n = 0;
  for (const auto& [count, text] : heaviest) {
    if (n++ == 8) break;
    o.stacks += "\n  " + std::to_string(count) + " " + text.substr(0, 300);
  }
  return o;
}

// Why the profile's kernel side lost a wait or sample whole: its aggregate or thread state
// could not be had, or its stack was not kept (its frames are none).
const std::vector<std::string> kLostReasons = {"map_full",       "thread_state",    "recursion",
                                               "stack_not_kept", "stack_collision", "stack_error",
                                               "wake_missed"};
// Why a wait lost its user frames: not taken at its call's return, or its walk cut
// (unwind_*: a process walked before its mappings were read, a file before its table).
const std::vector<std::string> kCutReasons = [] {
  std::vector<std::string> r = {"syscall_mismatch", "syscall_exec", "syscall_exited",
                                "syscall_kstack"};
  for (const std::string& end : test::walk_ends()) {
    if (end != "complete") r.push_back("unwind_" + end);
  }
  return r;
}();

// The profile's drop counts of these reasons, in all, after a drain.
std::uint64_t profile_dropped(test::StartedTracer& tracer, const MetricStore& metrics,
                              const std::vector<std::string>& reasons) {
  tracer->drain();
  double n = 0;
  for (const auto& reason : reasons) {
    n += test::counter_value(metrics, "ebpf_metricsd_dropped_events_total",
                             {{"tracer", "profile"}, {"reason", reason}});
  }
  return static_cast<std::uint64_t>(n);
}

// Every count of the profile tracer that says why a stack lost frames or was not unwound
// with CFI, and the unwinds by result: "reason=N ..." for those not zero.
std::string profile_counts(const MetricStore& metrics) {
  std::string out;
  const auto add = [&](const std::string& name, double v) {
    if (v > 0) out += " " + name + "=" + std::to_string(static_cast<long long>(v));
  };
  for (const char* reason : {"map_full", "thread_state", "announce_full", "syscall_mismatch",
                             "syscall_exec", "syscall_exited", "syscall_kstack", "stopped",
                             "stack_not_kept", "stack_collision", "stack_error", "stack_expired"}) {
    add(reason, test::counter_value(metrics, "ebpf_metricsd_dropped_events_total",
                                    {{"tracer", "profile"}, {"reason", reason}}));
  }
  for (const std::string& result : test::walk_ends())
    add("walk_" + result,
        test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total", {{"result", result}}));
  return out;
}

// The profile of one run of the workload. `held`: the last cut is taken while its process
// lives on after its work (its stacks named from mappings that can be read then); else
// after it exited (its threads' last accounting at exit in the window).
// `walked`: the stacks are walked in the kernel (`unwind: cfi`): the workload waits at its
// gate until a walk of it reaches main, so that its work is walked with its tables loaded
// (its first milliseconds are the subject of a test of their own).
// `walked_enough`: where a walk of it cannot reach main (test::open_when_walked).
ProfileWindow profile_run(profiling::Profiles& store, const std::string& binary, WorkloadRun& run,
                          SampleOracle* oracle = nullptr, bool held = true, bool walked = true,
                          const test::WalkedEnough& walked_enough = {}) {
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  bool cut = false;
  run = run_workload(
      binary, oracle,
      held ? std::function<void()>([&] { cut = store.cut(); }) : std::function<void()>(),
      walked ? std::function<void(pid_t)>(
                   [&](pid_t pid) { test::open_when_walked(store, pid, from, walked_enough); })
             : std::function<void(pid_t)>());
  if (!held) cut = store.cut();
  REQUIRE(cut);
  return store.store().window(from, profiling::Clock::now());
}

}  // namespace

TEST_CASE("profile: a known workload's CPU shares, blocked time and stacks", "[profile]") {
  MetricStore metrics;
  profiling::Profiles store;
  const bool cfi = GENERATE(true, false);
  auto tracer = test::start_tracer(
      metrics, "profile",
      frequency_option() + "    unwind: " + (cfi ? "cfi" : "frame_pointers") + "\n", &store);
  const bool frame_pointers = GENERATE(true, false);
  const std::string binary = frame_pointers ? PROFILE_WORKLOAD_FP : PROFILE_WORKLOAD_NOFP;
  // What the profile's kernel side counted as lost, in all: a wait whose aggregate or
  // thread state could not be had, or whose stack was not kept (its frames are none).
  const auto drops = [&] { return profile_dropped(tracer, metrics, kLostReasons); };
  const auto cut = [&] {
    tracer->drain();
    std::map<std::string, double> by;
    for (const auto& reason : kCutReasons) {
      by[reason] = test::counter_value(metrics, "ebpf_metricsd_dropped_events_total",
                                       {{"tracer", "profile"}, {"reason", reason}});
    }
    // Walks by how they ended: one that stopped short of wait_on_pipe shows here.
    for (const std::string& result : test::walk_ends()) {
      by["walk_" + result] =
          test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total", {{"result", result}});
    }
    return by;
  };
  const std::uint64_t drops0 = drops();
  const auto cut0 = cut();
  SampleOracle oracle(test_hz());
  WorkloadRun run;
  const ProfileWindow w = profile_run(store, binary, run, &oracle, /*held=*/true, /*walked=*/cfi);
  const Observed o = observe(w, run.pid);
  const std::uint64_t taken = oracle.samples();
  const std::uint64_t dropped = drops() - drops0;
  std::string cuts;
  {
    auto cut1 = cut();
    for (const auto& [k, v] : cut1) {
      if (v - cut0.at(k) > 0)
        cuts += " " + k + "=" + std::to_string(static_cast<long>(v - cut0.at(k)));
    }
  }
  const std::uint64_t hot = o.three.count + o.one.count;
  const double share = hot ? static_cast<double>(o.three.count) / static_cast<double>(hot) : 0;
  INFO(binary << " unwound by " << (cfi ? "CFI" : "frame pointers") << ": " << o.on_cpu
              << " on-CPU samples (" << o.warm_up << " in warm_up; the oracle took " << taken
              << "; CPU time " << run.cpu_ns / 1000000 << " ms), hot_three " << o.three.count
              << " (" << o.three.reaching << " reaching main), hot_one " << o.one.count
              << ", compare_slowly " << o.compare.count << " (" << o.compare.reaching
              << " reaching main); share " << share << "; waits in wait_on_pipe " << o.waits.count
              << " for " << o.waits.ns << " ns (" << o.waits.ns_reaching
              << " ns reaching reader; the reader measured " << run.blocked_ns << " ns), "
              << o.waits_with_pipe_read << " with pipe_read, " << o.waits_named_read
              << " in read, innermost kernel frame " << o.first_kernel_frame
              << "; waits in wait_for_signal " << o.cond_waits.count << " for " << o.cond_waits.ns
              << " ns (" << o.cond_waits.ns_reaching << " ns reaching waiter; the waiter measured "
              << run.cond_ns << " ns); hook " << tracer->hook() << "; dropped " << dropped
              << "; counted:" << cuts << "; stacks:" << o.stacks);

  // The workload ran 2 s of CPU time in its rounds: about 1,994 samples at 997 Hz, or
  // fewer where the host starved the guest's CPU. The oracle's perf events, at the same
  // frequency, took about as many of the process (the two sample at their own phases). Most
  // after the gate are in the three functions: all but 0.5% here, 85% or more in a starved
  // guest, where the start (exec, page faults on a slow disk) takes a larger share. Before
  // the gate opens the workload spins in warm_up() until the daemon has read it, as long as
  // the daemon takes (70% of the samples in a starved 5.10 guest).
  CHECK(static_cast<double>(o.on_cpu) > 0.9 * static_cast<double>(taken) - 20);
  CHECK(static_cast<double>(o.on_cpu) < 1.1 * static_cast<double>(taken) + 20);
  CHECK(hot + o.compare.count > (o.on_cpu - o.warm_up) / 2);
  REQUIRE(hot > taken / 10);
  // On-CPU: the leaf is right with frame pointers or without; 3:1 within 5 points, or 4
  // standard deviations of the share where fewer samples were taken.
  const double sd = std::sqrt(0.75 * 0.25 / static_cast<double>(hot));
  CHECK(std::abs(share - 0.75) < std::max(0.05, 4 * sd));
  // Off-CPU: every read blocked (the feeder writes only after the reader switched out), in
  // wait_on_pipe, for the time the reader measured, within 10%; a wait the kernel side could
  // not record is counted as dropped. With frame pointers alone, the read() of the C
  // library, which keeps no frame, hides wait_on_pipe: those waits are not found here.
  if (cfi) {
    CHECK(o.waits.count + dropped >= static_cast<std::uint64_t>(kReads));
    CHECK(static_cast<double>(o.waits.ns) > 0.9 * static_cast<double>(run.blocked_ns));
    CHECK(static_cast<double>(o.waits.ns) < 1.1 * static_cast<double>(run.blocked_ns));
    CHECK(static_cast<double>(o.cond_waits.ns) > 0.9 * static_cast<double>(run.cond_ns));
    CHECK(static_cast<double>(o.cond_waits.ns) < 1.1 * static_cast<double>(run.cond_ns));
    // The system call each wait was in.
    CHECK(o.waits_named_read == o.waits.count);
    CHECK(o.comm == "profile_workloa");  // the kernel's 15 characters
    // The kernel side of the wait, without the tracing machinery on top.
    CHECK(o.waits_with_pipe_read == o.waits.count);
    CHECK(o.first_kernel_frame.rfind("bpf_", 0) != 0);
    CHECK(o.first_kernel_frame.rfind("__traceiter", 0) != 0);
  }
  if (cfi) {
    // The user stacks go on to main (or the thread's start routine): at least 95% of the
    // leaf's samples, of the leaf called back through qsort() and of the time blocked.
    CHECK(ratio(o.three.reaching, o.three.count) >= 0.95);
    CHECK(ratio(o.compare.reaching, o.compare.count) >= 0.95);
    CHECK(ratio(o.waits.ns_reaching, o.waits.ns) >= 0.95);
    CHECK(ratio(o.cond_waits.ns_reaching, o.cond_waits.ns) >= 0.95);
  } else if (frame_pointers) {
    // Walked by frame pointer, in a program built with them: the leaf's callers.
    CHECK(ratio(o.three.reaching, o.three.count) >= 0.9);
  }

  // The window as pprof: well formed, with what the tests above found.
  perftools::profiles::Profile p;
  REQUIRE(p.ParseFromString(profiling::pprof_profile(w)));
  REQUIRE(p.string_table_size() > 0);
  CHECK(p.string_table(0).empty());
  REQUIRE(p.sample_type_size() == 3);
  CHECK(p.string_table(p.sample_type(0).type()) == "samples");
  CHECK(p.string_table(p.sample_type(1).type()) == "cpu");
  CHECK(p.string_table(p.sample_type(2).type()) == "off_cpu");
  CHECK(p.period() == 1000000000 / test_hz());
  std::set<std::uint64_t> ids;
  for (const auto& l : p.location()) CHECK((l.id() != 0 && ids.insert(l.id()).second));
  bool named = false;
  for (const auto& f : p.function()) named = named || p.string_table(f.name()) == "hot_three";
  CHECK(named);
  for (const auto& s : p.sample()) CHECK(s.value_size() == 3);
}

TEST_CASE("profile: offcpu_min keeps short waits out, and off_cpu: false keeps all out",
          "[profile]") {
  MetricStore metrics;
  profiling::Profiles store;
  WorkloadRun run;
  SECTION("offcpu_min above the workload's 20 ms waits") {
    auto tracer =
        test::start_tracer(metrics, "profile", "    frequency: 97\n    offcpu_min: 1s\n", &store);
    const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_FP, run);
    const Observed o = observe(w, run.pid);
    INFO("stacks of the workload:" << o.stacks);
    CHECK(o.three.count + o.one.count > 0);
    CHECK(o.waits.count == 0);
  }
  SECTION("off_cpu: false") {
    auto tracer =
        test::start_tracer(metrics, "profile", "    frequency: 97\n    off_cpu: false\n", &store);
    CHECK(tracer->hook() == "perf_event");
    const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_FP, run);
    const Observed o = observe(w, run.pid);
    INFO("stacks of the workload:" << o.stacks);
    CHECK(o.three.count + o.one.count > 0);
    CHECK(o.waits.count == 0);
  }
}

TEST_CASE("profile: a wait across reads is shared among the windows it spans, clipped to each",
          "[profile]") {
  MetricStore metrics;
  profiling::Profiles store;
  // With a copied stack the wait is sent at sys_exit as a ring record, else aggregated in
  // the kernel map: both carry when it began.
  const bool cfi = GENERATE(true, false);
  auto tracer = test::start_tracer(
      metrics, "profile",
      frequency_option() + "    unwind: " + (cfi ? "cfi" : "frame_pointers") + "\n", &store);
  int feed[2], report[2];
  REQUIRE(pipe2(feed, O_CLOEXEC) == 0);
  REQUIRE(pipe2(report, O_CLOEXEC) == 0);
  REQUIRE(store.cut());
  const auto t0 = profiling::Clock::now();
  // A child blocks in one read() until the test writes, three reads of the store later.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char c;
    const std::uint64_t begun = monotonic_ns();
    const ssize_t n = read(feed[0], &c, 1);
    const long long t[2] = {static_cast<long long>(begun), static_cast<long long>(monotonic_ns())};
    _exit(n == 1 && write(report[1], t, sizeof t) == sizeof t ? 0 : 1);
  }
  close(report[1]);
  // Blocked: asleep inside read() (system call 0), as the kernel reports it.
  REQUIRE(test::wait_until([&] { return asleep_in_read(child); }, std::chrono::seconds(30)));
  std::vector<profiling::Clock::time_point> marks = {t0};
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    REQUIRE(store.cut());
    marks.push_back(profiling::Clock::now());
  }
  // Still blocked: the two windows it was blocked through hold its wait in progress up to
  // the last read, whole, where it sleeps (the kernel's pipe read), not yet counted as a wait.
  {
    const ProfileWindow w = store.store().window(marks[1], marks[3]);
    const auto length = static_cast<std::uint64_t>((w.end - w.begin).count());
    std::uint64_t mine = 0, counted = 0, in_pipe_read = 0;
    for (const Sample& x : w.samples) {
      if (x.kind != SampleKind::OffCpu || x.pid != static_cast<std::uint32_t>(child)) continue;
      if (x.syscall != 0) continue;
      mine += x.ns;
      counted += x.count;
      if (has_function_containing(w, x.stack, "pipe_read", true)) in_pipe_read += x.ns;
    }
    INFO((cfi ? "cfi" : "frame pointers") << ": in progress, the child " << mine / 1000
                                          << " us of a window of " << length / 1000 << " us");
    CHECK(mine <= length + 1000000);
    CHECK(mine + 1000000 >= length);
    CHECK(in_pipe_read == mine);
    CHECK(counted == 0);
  }
  REQUIRE(write(feed[1], "x", 1) == 1);
  long long span[2] = {};
  REQUIRE(read(report[0], span, sizeof span) == sizeof span);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  close(feed[0]);
  close(feed[1]);
  close(report[0]);
  REQUIRE(store.cut());
  marks.push_back(profiling::Clock::now());

  // Each window: one read of the store. The child's time blocked in it, and the most
  // blocked time of any thread there.
  std::vector<double> child_ms, window_ms;
  std::string text;
  std::uint64_t waits = 0, over = 0;
  for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
    const ProfileWindow w = store.store().window(marks[i], marks[i + 1]);
    const auto length = static_cast<std::uint64_t>((w.end - w.begin).count());
    std::uint64_t mine = 0;
    std::map<std::uint32_t, std::uint64_t> by_thread;
    for (const Sample& x : w.samples) {
      if (x.kind != SampleKind::OffCpu) continue;
      by_thread[x.tid] += x.ns;
      // The child's wait in read(): the wait carries its system call (0); a wait of the
      // child's elsewhere (once in 5.10's slow guest: 7 ms more, in the write or exit after
      // the read) is not of it.
      if (x.pid == static_cast<std::uint32_t>(child) && x.syscall == 0) {
        mine += x.ns;
        waits += x.count;
      }
    }
    // No thread of the host is blocked longer than the window lasted (a wait ending in
    // the moment the maps are swapped may fall into the next one).
    for (const auto& [tid, ns] : by_thread) {
      if (ns > length + 1000000) {
        ++over;
        text += " tid " + std::to_string(tid) + " " + std::to_string(ns) + " ns;";
      }
    }
    child_ms.push_back(static_cast<double>(mine) / 1e6);
    window_ms.push_back(static_cast<double>(length) / 1e6);
    text += " window " + std::to_string(i) + ": " + std::to_string(length / 1000) +
            " us long, the child " + std::to_string(mine / 1000) + " us;";
  }
  const double read_ms = static_cast<double>(span[1] - span[0]) / 1e6;
  tracer->drain();
  INFO((cfi ? "cfi" : "frame pointers") << ": the child's read took " << read_ms << " ms;" << text
                                        << "\ncounted since the start:" << profile_counts(metrics));
  CHECK(over == 0);
  CHECK(waits == 1);
  // The two windows the child was blocked through: the whole of each, to a millisecond.
  for (std::size_t i : {1, 2}) {
    CHECK(child_ms[i] <= window_ms[i] + 1);
    CHECK(child_ms[i] >= window_ms[i] - 1);
  }
  // The first and last: a part of each, and all of the parts are the read's time.
  CHECK(child_ms[0] > 0);
  CHECK(child_ms[0] <= window_ms[0] + 1);
  CHECK(child_ms[3] > 0);
  CHECK(child_ms[3] <= window_ms[3] + 1);
  const double total = child_ms[0] + child_ms[1] + child_ms[2] + child_ms[3];
  CHECK(total <= read_ms + 1);
  CHECK(total >= 0.95 * read_ms);
}

TEST_CASE(
    "profile: each thread's time on a CPU is the kernel's own accounting, exited threads "
    "included",
    "[profile]") {
  MetricStore metrics;
  profiling::Profiles store;
  const bool off_cpu = GENERATE(true, false);
  auto tracer = test::start_tracer(
      metrics, "profile", frequency_option() + (off_cpu ? "" : "    off_cpu: false\n"), &store);
  WorkloadRun run;
  // The workload's threads all begin after the first read and have exited by the second:
  // all their time is in the window, from their last accounting at exit.
  const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_NOFP, run, nullptr, false);
  REQUIRE(w.accounted);
  std::uint64_t on = 0, threads = 0;
  std::string text;
  for (const profiling::ThreadTime& t : w.threads) {
    if (t.pid != static_cast<std::uint32_t>(run.pid)) continue;
    on += t.on_cpu_ns;
    ++threads;
    text += " tid " + std::to_string(t.tid) + " (" + t.comm + ") " +
            std::to_string(t.on_cpu_ns / 1000) + " us on, " +
            std::to_string(t.run_delay_ns / 1000) + " us runnable;";
  }
  // Two oracles bound it. Below: each thread's own CPU clock, read as the thread ended; ours
  // is taken later in its exit (at its last switch-out with the off-CPU programs, where its
  // exit begins without), so it is at least that, at any speed. Above: the CPU time wait4()
  // reports of the exited process, its threads' runtime summed by the kernel where each is
  // released; a thread that is not the leader is released before its last switch-out, so
  // ours may pass wait4's by the rest of those exits: about 0.1 ms a thread here, a few ms in
  // an emulated guest, 2% of the time at most.
  const auto oracle = static_cast<std::uint64_t>(run.cpu_ns);
  const auto floor = static_cast<std::uint64_t>(run.threads_cpu_ns);
  INFO("the workload's threads:" << text << " in all " << on << " ns; wait4 says " << oracle
                                 << " ns; the threads' own clocks as they ended " << floor
                                 << " ns");
  const std::uint64_t exits = std::max<std::uint64_t>(1000000, oracle / 50);
  CHECK(threads >= 4);
  CHECK(on <= oracle + exits);
  CHECK(on >= floor);
  CHECK(floor <= oracle);

  // A process alive and asleep at the read: its count is the kernel's, to the nanosecond. A
  // shell counts (its CPU time), then waits in read() on a pipe the test holds.
  int in[2];
  REQUIRE(pipe2(in, O_CLOEXEC) == 0);
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  pid_t shell = 0;
  {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                    const_cast<char*>("i=0; while [ $i -lt 10000 ]; do i=$((i+1)); done; read x"),
                    nullptr};
    REQUIRE(posix_spawn(&shell, "/bin/sh", &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
  }
  const std::string proc = "/proc/" + std::to_string(shell);
  const bool asleep =
      test::wait_until([&] { return asleep_in_read(shell); }, std::chrono::seconds(60));
  const auto runtime = [&] {
    std::uint64_t ns = 0;
    std::ifstream(proc + "/schedstat") >> ns;  // se.sum_exec_runtime (one thread)
    return ns;
  };
  const std::uint64_t before = runtime();
  REQUIRE(store.cut());
  const std::uint64_t after = runtime();
  REQUIRE(write(in[1], "x\n", 2) == 2);
  int status = 0;
  REQUIRE(waitpid(shell, &status, 0) == shell);
  close(in[0]);
  close(in[1]);
  REQUIRE(asleep);
  const ProfileWindow live = store.store().window(from, profiling::Clock::now());
  std::uint64_t counted = 0;
  for (const profiling::ThreadTime& t : live.threads) {
    if (t.pid == static_cast<std::uint32_t>(shell)) counted += t.on_cpu_ns;
  }
  INFO("the shell: " << counted << " ns counted; /proc says " << before << " ns before the read, "
                     << after << " after");
  CHECK(before > 0);
  CHECK(counted == before);
  CHECK(after == before);
}

TEST_CASE("profile: workloads keeps only the named cgroup and what is below it, labelled",
          "[profile][cgroup]") {
  test::TestCgroup named("profile");
  test::TestCgroup inner(named, "inner");
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer = test::start_tracer(
      metrics, "profile",
      frequency_option() + "    cgroup: true\n    workloads: [\"" + named.label() + "\"]\n",
      &store);
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  // The same workload at once inside (in a cgroup below the named one) and outside, each
  // with the CPU time of the other tests' runs: where a guest's CPUs are starved by its
  // host, a thread's CPU time as its kernel accounts it holds few samples.
  // The one inside is gated: it spins in warm_up() until the profile has walked it to main
  // (the daemon read it), at whatever speed, so that its waits are walked with its tables.
  const std::string cpu = std::to_string(kCpuMs);  // made here: the child only execs
  std::vector<char*> env = test::gated_environment();
  const pid_t inside = inner.spawn([&cpu, &env] {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    execle(PROFILE_WORKLOAD_FP, PROFILE_WORKLOAD_FP, cpu.c_str(), "5", static_cast<char*>(nullptr),
           env.data());
    _exit(127);
  });
  test::open_when_walked(store, inside, from);
  const WorkloadRun outside = run_workload(PROFILE_WORKLOAD_FP);
  int status = 0;
  REQUIRE(waitpid(inside, &status, 0) == inside);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(store.cut());
  const ProfileWindow w = store.store().window(from, profiling::Clock::now());
  const Observed in = observe(w, inside), out = observe(w, outside.pid);
  tracer->drain();
  INFO("inside:" << in.stacks << "\noutside:" << out.stacks
                 << "\ncounted since the start:" << profile_counts(metrics));
  // Sampled on the CPU at all, then named: the two checks tell a run too short in samples
  // from samples left unnamed.
  CHECK(in.on_cpu > 0);
  CHECK(in.three.count + in.one.count > 0);
  // Every read blocked in wait_on_pipe: found there, or counted as lost or as cut short of
  // that frame (only the named cgroup is seen, so every count is the workload's).
  std::vector<std::string> lost = kLostReasons;
  lost.insert(lost.end(), kCutReasons.begin(), kCutReasons.end());
  CHECK(in.waits.count >= 1);
  CHECK(in.waits.count <= 5);
  CHECK(in.waits.count + profile_dropped(tracer, metrics, lost) >= 5);
  CHECK(out.three.count + out.one.count == 0);
  CHECK(out.waits.count == 0);
  // Nothing from anywhere else, and the workload labels name the cgroup the thread ran in.
  std::set<std::string> cgroups;
  for (const auto& s : w.samples) cgroups.insert(s.workload.cgroup);
  CHECK(cgroups == std::set<std::string>{inner.label()});
}

namespace {

// A user stack as names from its leaf up to `root` (inclusive; the whole stack when it
// has none), unnamed frames as "?".
// Aliases of one function are one name: the C library's internal aliases
// ("__GI___qsort_r") and the symbol versions perf appends ("@@GLIBC_2.34") go, and so do
// leading underscores.
std::string chain(const std::vector<std::string>& names, const std::string& root) {
  std::string out;
  for (std::string n : names) {
    const bool unnamed = n.empty() || n == "[unknown]" || n.find("+0x") != std::string::npos;
    if (n.rfind("__GI_", 0) == 0) n.erase(0, 5);
    if (const auto at = n.find('@'); at != std::string::npos) n.erase(at);
    n.erase(0, n.find_first_not_of('_') == std::string::npos ? 0 : n.find_first_not_of('_'));
    out += (out.empty() ? "" : " <- ") + (unnamed ? std::string("?") : n);
    if (n == root) break;
  }
  return out;
}

// How much two distributions of chains agree: the sum over chains of the smaller share.
double overlap(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  double ta = 0, tb = 0, both = 0;
  for (const auto& [k, v] : a) ta += v;
  for (const auto& [k, v] : b) tb += v;
  if (ta == 0 || tb == 0) return 0;
  for (const auto& [k, v] : a) {
    if (auto it = b.find(k); it != b.end()) both += std::min(v / ta, it->second / tb);
  }
  return both;
}

std::string heaviest(const std::map<std::string, double>& m) {
  std::multimap<double, std::string, std::greater<>> by;
  for (const auto& [k, v] : m) by.emplace(v, k);
  std::string out;
  int n = 0;
  for (const auto& [v, k] : by) {
    if (n++ == 8) break;
    out += "\n    " + std::to_string(static_cast<long>(v)) + "  " + k;
  }
  return out;
}

// The user stacks of the samples of each process's main thread in `perf script -F
// comm,pid,tid,ip,sym,dso` output, each as function names from its leaf.
std::vector<std::vector<std::string>> perf_main_thread_stacks(const std::string& script) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(script);
  std::string line;
  std::vector<std::string> names;
  bool main_thread = false;
  const auto flush = [&] {
    if (main_thread) out.push_back(names);
    names.clear();
  };
  // "profile_workloa  4242/4242" starts a sample; "\t  55d0c0 hot_three+0x1c (/path)" is a
  // frame.
  const std::regex head(R"(^\S.*?\s(\d+)/(\d+)\s*$)");
  const std::regex frame(R"(^\s+[0-9a-f]+\s+(.*?)(\+0x[0-9a-f]+)?\s+\((.*)\)\s*$)");
  std::smatch m;
  bool started = false;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, head)) {
      if (started) flush();
      started = true;
      main_thread = m[1] == m[2];
    } else if (std::regex_match(line, m, frame)) {
      if (m[3].str().find("kernel") == std::string::npos) names.push_back(m[1]);
    }
  }
  if (started) flush();
  return out;
}

// A command run under `perf record -F 997 --call-graph dwarf` while the profile tracer
// samples at the same rate: the tracer's window of it, perf's script of its samples
// (comm,pid,tid,ip,sym,dso, no inlined frames) and what perf record printed.
struct PerfBeside {
  ProfileWindow window;
  std::string script, recorded;
  std::string tables;  // the tables built, by result, and the walks, by how they ended
};
PerfBeside perf_beside(const std::string& command) {
  // A walk of its own: the tables of files earlier tests' processes mapped (bpftrace's
  // libLLVM, 980,000 rows) are not there to crowd the command's out.
  profiling::Walker walker;
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer = test::start_tracer(metrics, "profile", "    frequency: 997\n", &store, &walker);
  const std::string data = "/tmp/emd-perf-" + std::to_string(getpid()) + ".data";
  PerfBeside out;
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  out.recorded = test::run_capture("perf record -F 997 --call-graph dwarf -o " + data + " -- " +
                                   command + " 2>&1");
  REQUIRE(store.cut());
  out.window = store.store().window(from, profiling::Clock::now());
  tracer->drain();
  const auto families = test::collect(metrics);
  out.tables =
      "tables:" + test::counters_text(families, "ebpf_metricsd_profile_unwind_tables_total", {}) +
      "\n  walks:" + test::counters_text(families, "ebpf_metricsd_profile_unwinds_total", {});
  out.script = test::run_capture("perf script -i " + data +
                                 " -F comm,pid,tid,ip,sym,dso --no-inline 2>/dev/null");
  std::remove(data.c_str());
  return out;
}

}  // namespace

// perf copies the user stack and unwinds it with libdw afterwards (--call-graph dwarf): the
// oracle of the CFI unwinder, on the workload built without frame pointers, at once.
TEST_CASE(
    "profile: a short-lived process's first samples, before its mappings are read, are cut "
    "and counted",
    "[profile][unwind]") {
  // Processes of 20 ms of CPU, run one after another: a walk that meets one before the
  // daemon has read its mappings (or loaded the tables of its files) ends there, with a last
  // frame that says why, counted by reason. Every sample of them reaches main, or _start's
  // end of the stack while the dynamic loader runs, or (another thread's) the C library's
  // thread start, or ends in such a frame: none is cut silently. How many reach main is a figure of
  // the machine's speed, stated, not asserted.
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer = test::start_tracer(metrics, "profile", frequency_option(), &store);
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  std::set<std::uint32_t> pids;
  for (int i = 0; i < 10; ++i) {
    const WorkloadRun run = run_workload(PROFILE_WORKLOAD_NOFP, nullptr, {}, {}, 20, 0);
    pids.insert(static_cast<std::uint32_t>(run.pid));
  }
  REQUIRE(store.cut());
  const ProfileWindow w = store.store().window(from, profiling::Clock::now());
  std::uint64_t total = 0, main = 0, started = 0, cut = 0;
  std::map<std::string, std::uint64_t> cut_by;
  std::string silent;
  for (const auto& s : w.samples) {
    if (!pids.count(s.pid) || s.kind != SampleKind::OnCpu) continue;
    const auto& frames = w.stacks[s.stack];
    const Frame* last = nullptr;
    for (std::uint32_t f : frames) {
      if (!w.frames[f].kernel) last = &w.frames[f];
    }
    if (!last) continue;  // in the kernel (its exec, its exit): no user stack to walk
    total += s.count;
    if (reaches(w, s.stack, "main")) {
      main += s.count;
    } else if (last->function.rfind("[stack cut: ", 0) == 0) {
      cut += s.count;
      cut_by[last->function] += s.count;
    } else if (last->function == "_start" || last->function == "_dl_start_user" ||
               last->function == "_dl_start") {
      started += s.count;
    } else if (s.tid != s.pid && last->module.find("/libc.so") != std::string::npos) {
      // Another thread's (the workload's reader, waiter, feeder), as it starts or ends: its
      // stack's end is the C library's thread start (clone3, whose return address is
      // undefined), where no symbol of Debian's libc names it.
      started += s.count;
    } else if (last->function == "[mappings not read]") {
      // Gone before the symbolizer read its mappings: counted apart
      // (ebpf_metricsd_profile_stacks_without_mappings_total).
      cut_by[last->function] += s.count;
    } else {
      silent += "\n  " + std::to_string(s.count) + ":";
      for (std::uint32_t f : frames) silent += " " + w.frames[f].function;
    }
  }
  std::string reasons;
  for (const auto& [why, n] : cut_by) reasons += " " + why + "=" + std::to_string(n);
  INFO(total << " samples of the short processes: " << main << " reach main, " << started
             << " the loader's start, " << cut << " cut:" << reasons
             << "; cut otherwise:" << silent);
  REQUIRE(total > 0);
  CHECK(silent.empty());
  // Counted by reason where they were cut (the kernel side's ends, read at the drain).
  tracer->drain();
  double counted = 0;
  for (const std::string& result : test::walk_ends()) {
    if (result != "complete")
      counted +=
          test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total", {{"result", result}});
  }
  CHECK(counted >= static_cast<double>(cut));
  WARN("20 ms processes: " << main << " of " << total << " samples reach main ("
                           << (total
                                   ? 100.0 * static_cast<double>(main) / static_cast<double>(total)
                                   : 0.0)
                           << "%), " << cut << " cut:" << reasons);
}

TEST_CASE(
    "profile: more code than the tables hold: the files that do not fit are counted, the "
    "walks end at their frames",
    "[profile][unwind]") {
  // The walk's maps with room for 1,024 rows: Debian's libc alone needs 28,295 and never
  // fits. The workload's own table (194 rows) does where no other file took the room first:
  // tables load in the order processes are read, and any process on the host may be read
  // before the workload (the tiny libraries of a compiler running beside the test). Either
  // way each walk of the work ends, counted, at the first frame of a file that did not fit:
  // where it enters the C library (main's caller, qsort, a thread's start) when the
  // workload's table loaded, at its leaf when it did not. Nothing else changes: the daemon
  // keeps sampling and naming.
  profiling::ProcessManager::Options options;
  options.maps.rows = 1u << 10;
  profiling::Walker walker(options);
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer = test::start_tracer(metrics, "profile", frequency_option() + "    off_cpu: false\n",
                                   &store, &walker);
  // The work starts once a walk of warm_up() went as far as the tables let it: the process
  // read, its files' tables loaded or refused.
  const auto settled = [](profiling::Profiles& s, pid_t pid, profiling::Clock::time_point from) {
    return test::sampled(s, pid, from, [](const std::vector<const Frame*>& frames) {
      return test::has_frame(frames, "warm_up") &&
             frames.back()->function != "[stack cut: not_read]" &&
             frames.back()->function != "[stack cut: not_loaded]";
    });
  };
  WorkloadRun run;
  const ProfileWindow w =
      profile_run(store, PROFILE_WORKLOAD_NOFP, run, nullptr, true, true, settled);
  // The work (its leaves run only after the gate opened) and the rest (the warm-up before:
  // walks that met the process before it was read end so, counted too). A walk of the work
  // may also meet the process while the daemon reads its mappings again (a re-read asked for
  // by the walks that end at libc; seen in the emulated 5.10 guest, where a read takes
  // long): cut not_read, counted.
  std::uint64_t work = 0, work_no_table = 0, work_at_leaf = 0, work_reading = 0, no_table = 0,
                three = 0, three_main = 0;
  std::string other;
  const std::set<std::string> work_leaves = {"hot_three", "hot_one", "compare_slowly"};
  for (const auto& s : w.samples) {
    if (s.pid != static_cast<std::uint32_t>(run.pid) || s.kind != SampleKind::OnCpu) continue;
    const std::vector<const Frame*> frames = test::user_frames(w, s.stack);
    if (frames.empty()) continue;
    const Frame* leaf = frames.front();
    // The last user frame (the cut's mark) and the one before it (where the walk ended).
    const Frame* last = frames.back();
    const Frame* ended_at = frames.size() > 1 ? frames[frames.size() - 2] : nullptr;
    const bool at_no_table = last->function == "[stack cut: no_table]";
    if (at_no_table) no_table += s.count;
    const bool reading = last->function == "[stack cut: not_read]";
    const bool is_work = work_leaves.count(leaf->function) > 0;
    if (is_work) {
      work += s.count;
      if (at_no_table && ended_at == leaf) {
        work_at_leaf += s.count;
      } else if (at_no_table && ended_at &&
                 ended_at->module.find("/libc.so") != std::string::npos) {
        work_no_table += s.count;
      }
      if (reading) work_reading += s.count;
    }
    // Other walks: any counted cut (the dynamic loader's lazy binding, whose CFI is an
    // expression, ends `unsupported`).
    const bool cut = last->function.rfind("[stack cut: ", 0) == 0;
    if ((!cut || (is_work && !at_no_table && !reading)) && other.size() < 2000) {
      other += "\n  " + std::to_string(s.count) + ":";
      for (std::uint32_t f : w.stacks[s.stack]) other += " " + w.frames[f].function;
    }
    // Of hot_three's walks with the process's mappings (one cut in a read of them, counted
    // above, found none): those that reach main.
    if (leaf->function == "hot_three" && !reading) {
      three += s.count;
      if (reaches(w, s.stack, "main")) three_main += s.count;
    }
  }
  tracer->drain();
  const double rows_full = test::counter_value(metrics, "ebpf_metricsd_profile_unwind_tables_total",
                                               {{"result", "rows_full"}});
  const double ended =
      test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total", {{"result", "no_table"}});
  // The workload's table loaded: its walks leave the leaf (all of them or none).
  const bool fitted = work_at_leaf == 0;
  INFO(work << " samples of the work, " << work_no_table << " ending at the C library's first "
            << "frame, " << work_at_leaf << " at the leaf, " << work_reading
            << " in a read of the process; hot_three " << three_main << " of " << three
            << " walked with its mappings"
            << " reach main; rows_full " << rows_full << "; other ends:" << other);
  REQUIRE(work > 0);
  CHECK(rows_full >= 1);
  // Every walk of the work ends at the first frame of a file that did not fit, saying so
  // (or, in a read of the process, at once, saying so); every other walk ends in a cut
  // frame too (none is complete without libc's table, none silent).
  CHECK((fitted ? work_no_table : work_at_leaf) + work_reading == work);
  CHECK(work_reading * 10 <= work);
  CHECK(other.empty());
  CHECK(ended >= static_cast<double>(no_table));
  if (fitted) {
    CHECK(ratio(three_main, three) >= 0.95);
  } else {
    // Crowded out, not refused otherwise: libc and the workload both found no rows, after
    // other files took them.
    WARN("the workload's table found no room: other processes' files were read first");
    CHECK(rows_full >= 2);
    CHECK(test::counter_value(metrics, "ebpf_metricsd_profile_unwind_tables_total",
                              {{"result", "loaded"}}) >= 1);
  }
}

TEST_CASE(
    "profile: a process running code of no file is read again and again, each read finding "
    "what the last did",
    "[profile][unwind]") {
  // A JIT's code: walks there end no_mapping and ask for the process again, and the daemon
  // reads it at growing pauses (10 ms, doubled up to 10 s). Each read after the first finds
  // the same files at the same places, so it keeps the settlement's epoch, and with it what
  // the walks cached of the process's frames.
  profiling::Walker walker;
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer = test::start_tracer(metrics, "profile", frequency_option() + "    off_cpu: false\n",
                                   &store, &walker);
  const profiling::ProcessManager::Counts before = walker.get().counts();
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t jit = fork();
  REQUIRE(jit >= 0);
  if (jit == 0) {
    void* code =
        mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) _exit(3);
    static const unsigned char spin[] = {0xeb, 0xfe};  // jmp to itself
    std::memcpy(code, spin, sizeof spin);
    (void)!write(ready[1], "x", 1);
    reinterpret_cast<void (*)()>(code)();
  }
  close(ready[1]);
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  // Reads at 10, 20, 40 and 80 ms after the first: well within a minute of any machine's.
  const auto unchanged = [&] {
    return walker.get().counts().reads_unchanged - before.reads_unchanged;
  };
  const bool read_again =
      test::wait_until([&] { return unchanged() >= 4; }, std::chrono::seconds(60));
  const profiling::ProcessManager::Counts after = walker.get().counts();
  kill(jit, SIGKILL);
  waitpid(jit, nullptr, 0);
  tracer->drain();
  const double no_mapping = test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total",
                                                {{"result", "no_mapping"}});
  INFO("reads " << after.processes_read - before.processes_read << ", unchanged " << unchanged()
                << "; walks ended no_mapping " << no_mapping);
  CHECK(no_mapping >= 4);
  CHECK(read_again);
  // Every read but a process's first may find what the last did: the test's process read
  // first, and each of the others' too.
  CHECK(after.processes_read - before.processes_read >
        after.reads_unchanged - before.reads_unchanged);
}

TEST_CASE(
    "profile: a program whose call frame information lies has its own stacks cut, counted; "
    "every other process is walked as before",
    "[profile][unwind]") {
  // crafted_cfi's three spin functions describe their frames wrongly (the CFA at rsp, the
  // return address 1 GiB away, the CFA an expression), as a user's hostile binary may. Each
  // of its samples there ends in the cut its lie earns (or, before the process was read, in
  // not_read or not_loaded), named only from its own files; the known workload run beside it
  // reaches main as in the first test.
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer =
      test::start_tracer(metrics, "profile", frequency_option() + "    off_cpu: false\n", &store);
  test::SpawnedWorkload crafted({CRAFTED_CFI});
  const auto crafted_pid = static_cast<std::uint32_t>(crafted.pid());  // finish() forgets it
  WorkloadRun run;
  const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_NOFP, run);
  CHECK(crafted.finish() == 0);
  const std::map<std::string, std::string> earned = {
      {"spin_cfa_at_sp", "[stack cut: bad_frame]"},
      {"spin_ra_far", "[stack cut: unreadable]"},
      {"spin_cfa_expression", "[stack cut: unsupported]"}};
  std::map<std::string, std::uint64_t> cut_as_earned;
  std::string wrong;
  for (const auto& s : w.samples) {
    if (s.pid != crafted_pid || s.kind != SampleKind::OnCpu) continue;
    const auto user = test::user_frames(w, s.stack);
    if (user.empty()) continue;
    const Frame* leaf = user.front();
    const Frame* last = user.back();
    // a frame named from a file the process does not map
    const bool foreign = std::any_of(user.begin(), user.end(), [](const Frame* f) {
      return !(f->module == CRAFTED_CFI || f->module == "[unknown]" ||
               f->module.find("/libc.so") != std::string::npos ||
               f->module.find("/ld-linux") != std::string::npos ||
               f->module.find("vdso") != std::string::npos);
    });
    const auto e = earned.find(leaf->function);
    const bool early =
        last->function == "[stack cut: not_read]" || last->function == "[stack cut: not_loaded]";
    if (e != earned.end() && last->function == e->second) {
      cut_as_earned[leaf->function] += s.count;
    } else if ((e != earned.end() && !early) || foreign) {
      wrong += "\n  " + std::to_string(s.count) + ":";
      for (std::uint32_t f : w.stacks[s.stack])
        wrong += " " + w.frames[f].function + " (" + w.frames[f].module + ")";
    }
  }
  tracer->drain();
  INFO("cut as earned: bad_frame "
       << cut_as_earned["spin_cfa_at_sp"] << ", unreadable " << cut_as_earned["spin_ra_far"]
       << ", unsupported " << cut_as_earned["spin_cfa_expression"] << "; otherwise:" << wrong);
  CHECK(wrong.empty());
  for (const auto& [leaf, end] : earned) {
    CHECK(cut_as_earned[leaf] > 0);
    const std::string result = end.substr(12, end.size() - 13);  // "[stack cut: X]" -> X
    CHECK(test::counter_value(metrics, "ebpf_metricsd_profile_unwinds_total",
                              {{"result", result}}) >= static_cast<double>(cut_as_earned[leaf]));
  }
  // The workload beside it: as in the first test.
  const Observed o = observe(w, run.pid);
  INFO(o.stacks);
  CHECK(ratio(o.three.reaching, o.three.count) >= 0.95);
  CHECK(ratio(o.compare.reaching, o.compare.count) >= 0.95);
}

TEST_CASE(
    "profile: a library unloaded and another loaded at its address: each walked with "
    "its own table",
    "[profile][unwind]") {
  // swap_workload: rounds of dlopen(A), CPU in A's code (main -> swap_round -> run_a ->
  // spin_a), dlclose(A), and the same with B, whose run_b keeps a frame 4 KiB larger. The
  // libraries usually take turns at one address: a walk of B's code with A's table (or the
  // reverse) would go astray. Gated: after each load the library's code spins until the
  // profile has walked it to main (the daemon read the process with the library in it, at
  // whatever speed), then 200 ms more. Every sample in a library's code reaches main through
  // its own run_ function, or is cut with the reason (a walk before that read, or between an
  // unmapping and the next); never through the other library; and in each round's 200 ms
  // after its gate, most reach main.
  MetricStore metrics;
  profiling::Profiles store;
  auto tracer =
      test::start_tracer(metrics, "profile", frequency_option() + "    off_cpu: false\n", &store);
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  constexpr int kRounds = 5;
  test::SpawnedWorkload workload(
      {SWAP_WORKLOAD, SWAP_LIB_A, SWAP_LIB_B, std::to_string(kRounds), "200"},
      test::SpawnedWorkload::Gate::Caller, test::SpawnedWorkload::Output::Piped);
  const pid_t pid = workload.pid();
  // The windows after each gate: [gate opened, next load or the end).
  std::vector<std::pair<profiling::Clock::time_point, profiling::Clock::time_point>> after;
  std::string same_line;
  char buf[128];
  while (fgets(buf, sizeof buf, workload.output())) {
    const std::string line = buf;
    if (!after.empty() && after.back().second == profiling::Clock::time_point{})
      after.back().second = profiling::Clock::now();
    if (line.rfind("loaded ", 0) != 0) {
      same_line += line;
      continue;
    }
    const std::string run = "run_" + line.substr(7, 1);
    const auto loaded = profiling::Clock::now();
    bool walked = false;
    for (int i = 0; i < 1200 && !walked; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      REQUIRE(store.cut());
      walked = test::walked_to_main(store, pid, loaded, run);
    }
    if (!walked) {
      // How the walks of the workload ended meanwhile, and the daemon's counts.
      const ProfileWindow w = store.store().window(loaded, profiling::Clock::now());
      std::map<std::string, std::uint64_t> ends;
      for (const auto& x : w.samples) {
        if (x.pid != static_cast<std::uint32_t>(pid)) continue;
        std::string text;
        for (std::uint32_t f : w.stacks[x.stack]) text += " " + w.frames[f].function;
        ends[text] += x.count;
      }
      std::string text;
      for (const auto& [stack, n] : ends) text += "\n  " + std::to_string(n) + stack;
      INFO("no walk of " << run << " reached main; the workload's samples:" << text);
      INFO(test::counters_text(test::collect(metrics), "ebpf_metricsd_profile_unwinds_total", {}));
      REQUIRE(walked);
    }
    after.emplace_back(profiling::Clock::now(), profiling::Clock::time_point{});
    REQUIRE(kill(pid, SIGUSR1) == 0);
  }
  REQUIRE(workload.finish() == 0);
  if (!after.empty() && after.back().second == profiling::Clock::time_point{})
    after.back().second = profiling::Clock::now();
  REQUIRE(after.size() == 2 * kRounds);
  std::smatch m;
  REQUIRE(std::regex_search(same_line, m, std::regex(R"(same_address (\d+))")));
  const int same = std::stoi(m[1]);
  REQUIRE(store.cut());

  struct Lib {
    const char *spin, *run, *other_run;
    std::uint64_t total = 0, main = 0, cut = 0, wrong = 0;
  };
  std::string wrong, reasons;
  // Counts the samples in each library's code of window w into libs.
  const auto count = [&](const ProfileWindow& w, Lib* libs, bool keep_text) {
    for (const auto& s : w.samples) {
      if (s.pid != static_cast<std::uint32_t>(pid)) continue;
      const auto user = test::user_frames(w, s.stack);
      if (user.empty()) continue;
      const Frame* leaf = user.front();
      for (int i = 0; i < 2; ++i) {
        Lib& lib = libs[i];
        if (leaf->function != lib.spin) continue;
        lib.total += s.count;
        const auto& frames = w.stacks[s.stack];
        const Frame& last = w.frames[frames.back()];
        std::string text;
        for (std::uint32_t f : frames) text += " " + w.frames[f].function;
        if (has_function(w, s.stack, lib.other_run, false)) {
          lib.wrong += s.count;
          if (keep_text) wrong += "\n " + text;
        } else if (reaches(w, s.stack, "main") && has_function(w, s.stack, lib.run, false)) {
          lib.main += s.count;
        } else if (last.function.rfind("[stack cut: ", 0) == 0) {
          lib.cut += s.count;
          if (keep_text) reasons += " " + last.function;
        } else {
          lib.wrong += s.count;
          if (keep_text) wrong += "\n " + text;
        }
      }
    }
  };
  Lib all[] = {{"spin_a", "run_a", "run_b"}, {"spin_b", "run_b", "run_a"}};
  count(store.store().window(from, profiling::Clock::now()), all, true);
  Lib gated[] = {{"spin_a", "run_a", "run_b"}, {"spin_b", "run_b", "run_a"}};
  for (const auto& [begin, end] : after) count(store.store().window(begin, end), gated, false);
  INFO("same address in " << same << " of " << kRounds << " rounds; A: " << all[0].main << " of "
                          << all[0].total << " reach main, " << all[0].cut << " cut (after the "
                          << "gates " << gated[0].main << " of " << gated[0].total
                          << "); B: " << all[1].main << " of " << all[1].total << ", " << all[1].cut
                          << " cut (after the gates " << gated[1].main << " of " << gated[1].total
                          << ");" << reasons << "; astray:" << wrong);
  for (int i = 0; i < 2; ++i) {
    CHECK(all[i].wrong == 0);
    // Each round's gate opened on a walk to main.
    CHECK(all[i].main >= static_cast<std::uint64_t>(kRounds));
    // After the read, the walks have the library's table: cut only by the unmapping at the
    // round's end (and a sample in flight at the gate).
    CHECK(gated[i].main * 2 >= gated[i].total);
  }
  if (same == 0) WARN("the libraries never took turns at one address on this machine");
}

TEST_CASE("profile: perf --call-graph dwarf on the same workload agrees on whole stacks",
          "[profile][external]") {
  // perf runs the workload itself: its samples are of that process alone.
  const PerfBeside run = perf_beside(std::string(PROFILE_WORKLOAD_NOFP) + " 2000 5");
  const ProfileWindow& w = run.window;
  const std::string& script = run.script;
  INFO("perf record: " << run.recorded << "\n  " << run.tables);

  // The main thread's on-CPU stacks with one of the workload's leaves, leaf to main.
  const std::set<std::string> leaves = {"hot_three", "hot_one", "compare_slowly"};
  std::map<std::string, double> theirs, ours;
  for (const auto& names : perf_main_thread_stacks(script)) {
    if (!names.empty() && leaves.contains(names.front())) theirs[chain(names, "main")] += 1;
  }
  pid_t pid = 0;
  for (const auto& s : w.samples) {
    if (s.comm == "profile_workloa" && s.kind == SampleKind::OnCpu && s.pid == s.tid) pid = s.pid;
  }
  std::uint64_t copies = 0;
  std::string unknown;  // the frames of one of our stacks whose chain perf did not find
  for (const auto& s : w.samples) {
    if (static_cast<pid_t>(s.pid) != pid || s.tid != s.pid || s.kind != SampleKind::OnCpu) continue;
    std::vector<std::string> names;
    std::ostringstream frames;
    for (std::uint32_t f : w.stacks[s.stack]) {
      if (w.frames[f].kernel) continue;
      names.push_back(w.frames[f].function);
      frames << "\n    " << w.frames[f].function << " " << w.frames[f].module << "+0x" << std::hex
             << w.frames[f].address << std::dec;
    }
    if (!names.empty() && leaves.contains(names.front())) {
      ours[chain(names, "main")] += static_cast<double>(s.count);
      copies += s.count;
      if (unknown.empty() && !theirs.contains(chain(names, "main"))) unknown = frames.str();
    }
  }
  const double agree = overlap(ours, theirs);
  // Our samples whose chain from the leaf to main is one perf found too.
  double known = 0;
  for (const auto& [c, n] : ours) known += theirs.contains(c) ? n : 0;
  const double known_share = known / static_cast<double>(copies);
  INFO("stacks, leaf to main: ours" << heaviest(ours) << "\n  perf's" << heaviest(theirs)
                                    << "\n  agreement " << agree << ", chains perf found too "
                                    << known_share
                                    << "\n  one of ours perf did not find:" << unknown);
  REQUIRE(copies > 200);
  REQUIRE(theirs.size() > 0);
  // At least 95% of the samples have the same function names from the leaf to main as
  // perf's do.
  CHECK(known_share >= 0.95);
  // And the two profilers' shares of each chain agree within what two samplers of 2,000
  // samples each differ by: each samples the workload's rounds of about 1 ms at its own phase, and
  // with another process busy on a CPU the overlap was measured from 0.94 to 0.99.
  CHECK(agree >= 0.9);
}

// A distribution's own binary, built without frame pointers as Debian builds: Python's
// interpreter running a CPU-bound script. Its samples reach main() as often as perf's
// --call-graph dwarf finds, within 5 points, and at least 90% of the time.
TEST_CASE("profile: /usr/bin/python3.11 reaches main as perf --call-graph dwarf does",
          "[profile][external]") {
  const std::string python = "/usr/bin/python3.11";
  if (access(python.c_str(), X_OK) != 0) {
    WARN(python << " is not installed: skipped");
    return;
  }
  // About 2 s of CPU in nested Python calls.
  const PerfBeside run = perf_beside(python +
                                     " -c 'import time\n"
                                     "def leaf(n):\n    return sum(i * i for i in range(n))\n"
                                     "def middle(t):\n    while time.process_time() < t:\n"
                                     "        leaf(1000)\n"
                                     "middle(2.0)'");
  const ProfileWindow& w = run.window;
  INFO("perf record: " << run.recorded << "\n  " << run.tables);
  // Debian's python3.11 main() ends in a jump to Py_BytesMain (a tail call): no stack holds
  // main itself, Py_BytesMain stands in its place.
  const auto reaches_main = [](const std::vector<std::string>& names) {
    return std::find_if(names.begin(), names.end(), [](const std::string& n) {
             return n == "main" || n == "Py_BytesMain";
           }) != names.end();
  };
  std::uint64_t theirs = 0, theirs_main = 0;
  for (const auto& names : perf_main_thread_stacks(run.script)) {
    if (names.empty()) continue;
    ++theirs;
    theirs_main += reaches_main(names);
  }
  std::uint64_t ours = 0, ours_main = 0;
  std::string sample_stacks;
  for (const auto& s : w.samples) {
    if (s.comm != "python3.11" || s.kind != SampleKind::OnCpu || s.tid != s.pid) continue;
    std::vector<std::string> names;
    for (std::uint32_t f : w.stacks[s.stack]) {
      if (!w.frames[f].kernel) names.push_back(w.frames[f].function);
    }
    if (names.empty()) continue;
    ours += s.count;
    if (reaches_main(names)) {
      ours_main += s.count;
    } else if (sample_stacks.size() < 3000) {
      sample_stacks += "\n  " + chain(names, "main");
    }
  }
  REQUIRE(ours > 200);
  REQUIRE(theirs > 200);
  const double our_share = static_cast<double>(ours_main) / static_cast<double>(ours);
  const double their_share = static_cast<double>(theirs_main) / static_cast<double>(theirs);
  INFO("reaching main: ours " << ours_main << "/" << ours << " (" << our_share << "), perf's "
                              << theirs_main << "/" << theirs << " (" << their_share
                              << "); some of ours that do not:" << sample_stacks);
  CHECK(our_share >= 0.90);
  CHECK(std::abs(our_share - their_share) <= 0.05);
}
