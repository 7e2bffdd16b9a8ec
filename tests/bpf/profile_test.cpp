// The profile tracer on the real kernel, against a known workload the test runs
// (tests/profile_workload): CPU time split 3:1 between two functions, and a thread blocked
// in a known function for a time it measures itself.
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../cgroup_fixture.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/profile/pprof.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "profile.pb.h"
#include "sample_oracle.skel.h"
#include "tracer_fixture.h"

extern char** environ;

using namespace ebpf_metricsd;
using profiling::Frame;
using profiling::ProfileWindow;
using profiling::SampleKind;

namespace {

// CPU time of hot_three + hot_one (at 997 Hz about 2,000 samples, fewer where the host starves
// a guest's CPU: the oracle below counts them), and reads of 20 ms.
constexpr int kCpuMs = 2000;
constexpr int kReads = 25;

struct WorkloadRun {
  pid_t pid = 0;
  long long blocked_ns = 0;
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

WorkloadRun run_workload(const std::string& binary, SampleOracle* oracle = nullptr) {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  const std::string cpu = std::to_string(kCpuMs), reads = std::to_string(kReads);
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>(cpu.c_str()),
                  const_cast<char*>(reads.c_str()), nullptr};
  WorkloadRun run;
  REQUIRE(posix_spawn(&run.pid, binary.c_str(), &actions, nullptr, argv, environ) == 0);
  if (oracle) oracle->target(run.pid);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  REQUIRE(waitpid(run.pid, &status, 0) == run.pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(text.rfind("blocked_ns ", 0) == 0);
  run.blocked_ns = std::atoll(text.c_str() + 11);
  return run;
}

// The first user frame of a stack (innermost first), or nullptr.
const Frame* leaf_user_frame(const ProfileWindow& w, std::uint32_t stack) {
  for (std::uint32_t f : w.stacks[stack]) {
    if (!w.frames[f].kernel) return &w.frames[f];
  }
  return nullptr;
}

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

struct Observed {
  std::string stacks;                      // the workload's heaviest stacks, for messages
  std::uint64_t on_cpu = 0;                // on-CPU samples
  std::uint64_t three = 0, one = 0;        // on-CPU samples with that leaf
  std::uint64_t three_with_main = 0;       // ... whose stack reaches main
  std::uint64_t waits = 0, wait_ns = 0;    // off-CPU in wait_on_pipe
  std::uint64_t waits_with_pipe_read = 0;  // ... with pipe_read among the kernel frames
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
    if (s.kind == SampleKind::OnCpu) o.on_cpu += s.count;
    const Frame* leaf = leaf_user_frame(w, s.stack);
    if (!leaf) continue;
    if (s.kind == SampleKind::OnCpu) {
      if (leaf->function == "hot_three") {
        o.three += s.count;
        if (has_function(w, s.stack, "main", false)) o.three_with_main += s.count;
      } else if (leaf->function == "hot_one") {
        o.one += s.count;
      }
    } else if (leaf->function == "wait_on_pipe") {
      o.waits += s.count;
      o.wait_ns += s.ns;
      o.comm = s.comm;
      if (has_function_containing(w, s.stack, "pipe_read", true)) o.waits_with_pipe_read += s.count;
      const auto& frames = w.stacks[s.stack];
      if (!frames.empty() && w.frames[frames.front()].kernel) {
        o.first_kernel_frame = w.frames[frames.front()].function;
      }
    }
  }
  int n = 0;
  for (const auto& [count, text] : heaviest) {
    if (n++ == 6) break;
    o.stacks += "\n  " + std::to_string(count) + " " + text.substr(0, 200);
  }
  return o;
}

ProfileWindow profile_run(profiling::ProfileStore& store, const std::string& binary,
                          WorkloadRun& run, SampleOracle* oracle = nullptr) {
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  run = run_workload(binary, oracle);
  REQUIRE(store.cut());
  return store.window(from, profiling::Clock::now());
}

}  // namespace

TEST_CASE("profile: a known workload's CPU shares, blocked time and stacks", "[profile]") {
  MetricStore metrics;
  profiling::ProfileStore store;
  // 997 Hz (a prime) for about two thousand samples of the workload's two seconds of CPU.
  auto tracer = test::start_tracer(metrics, "profile", "    frequency: 997\n", &store);
  const bool frame_pointers = GENERATE(true, false);
  const std::string binary = frame_pointers ? PROFILE_WORKLOAD_FP : PROFILE_WORKLOAD_NOFP;
  // What the profile's kernel side counted as dropped (a wait whose thread state or stack
  // could not be had is one), in all.
  const auto drops = [&] {
    tracer->drain();
    double n = 0;
    for (const char* reason : {"map_full", "stack_map_full", "stack_collision", "stack_truncated",
                               "stack_error", "thread_state", "announce_full", "recursion"}) {
      n += test::counter_value(metrics, "ebpf_metricsd_dropped_events_total",
                               {{"tracer", "profile"}, {"reason", reason}});
    }
    return static_cast<std::uint64_t>(n);
  };
  const std::uint64_t drops0 = drops();
  SampleOracle oracle(997);
  WorkloadRun run;
  const ProfileWindow w = profile_run(store, binary, run, &oracle);
  const Observed o = observe(w, run.pid);
  const std::uint64_t taken = oracle.samples();
  const std::uint64_t dropped = drops() - drops0;
  const double share =
      o.three + o.one ? static_cast<double>(o.three) / static_cast<double>(o.three + o.one) : 0;
  INFO(binary << ": " << o.on_cpu << " on-CPU samples (the oracle took " << taken << "), hot_three "
              << o.three << " (" << o.three_with_main << " reaching main), hot_one " << o.one
              << "; share " << share << "; waits " << o.waits << " for " << o.wait_ns
              << " ns (the reader measured " << run.blocked_ns << " ns), " << o.waits_with_pipe_read
              << " with pipe_read, innermost kernel frame " << o.first_kernel_frame << "; hook "
              << tracer->hook() << "; dropped " << dropped << "; stacks:" << o.stacks);

  // The workload ran 2 s of CPU time in the two functions: about 1,994 samples at 997 Hz, or
  // fewer where the host starved the guest's CPU. The oracle's perf events, at the same
  // frequency, took about as many of the process (the two sample at their own phases). Most
  // are in the two functions: all but 0.5% here, 85% or more in a starved guest, where the
  // start (exec, page faults on a slow disk) takes a larger share.
  CHECK(static_cast<double>(o.on_cpu) > 0.9 * static_cast<double>(taken) - 20);
  CHECK(static_cast<double>(o.on_cpu) < 1.1 * static_cast<double>(taken) + 20);
  CHECK(o.three + o.one > o.on_cpu / 2);
  REQUIRE(o.three + o.one > 200);
  // On-CPU: the leaf is right with frame pointers or without; 3:1 within 5 points, or 4
  // standard deviations of the share where fewer samples were taken.
  const double sd = std::sqrt(0.75 * 0.25 / static_cast<double>(o.three + o.one));
  CHECK(std::abs(share - 0.75) < std::max(0.05, 4 * sd));
  // Off-CPU: every read blocked (the feeder writes only after the reader switched out), in
  // wait_on_pipe, for the time the reader measured, within 10%; a wait the kernel side could
  // not record is counted as dropped.
  CHECK(o.waits + dropped >= static_cast<std::uint64_t>(kReads));
  CHECK(static_cast<double>(o.wait_ns) > 0.9 * static_cast<double>(run.blocked_ns));
  CHECK(static_cast<double>(o.wait_ns) < 1.1 * static_cast<double>(run.blocked_ns));
  CHECK(o.comm == "profile_workloa");  // the kernel's 15 characters
  // The kernel side of the wait, without the tracing machinery on top.
  CHECK(o.waits_with_pipe_read == o.waits);
  CHECK(o.first_kernel_frame.rfind("bpf_", 0) != 0);
  CHECK(o.first_kernel_frame.rfind("__traceiter", 0) != 0);
  if (frame_pointers) {
    // With frame pointers the user stack goes on to the callers.
    CHECK(o.three_with_main * 10 >= o.three * 9);
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
  CHECK(p.period() == 1000000000 / 997);
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
  profiling::ProfileStore store;
  WorkloadRun run;
  SECTION("offcpu_min above the workload's 20 ms waits") {
    auto tracer =
        test::start_tracer(metrics, "profile", "    frequency: 97\n    offcpu_min: 1s\n", &store);
    const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_FP, run);
    const Observed o = observe(w, run.pid);
    INFO("stacks of the workload:" << o.stacks);
    CHECK(o.three + o.one > 0);
    CHECK(o.waits == 0);
  }
  SECTION("off_cpu: false") {
    auto tracer =
        test::start_tracer(metrics, "profile", "    frequency: 97\n    off_cpu: false\n", &store);
    CHECK(tracer->hook() == "perf_event");
    const ProfileWindow w = profile_run(store, PROFILE_WORKLOAD_FP, run);
    const Observed o = observe(w, run.pid);
    INFO("stacks of the workload:" << o.stacks);
    CHECK(o.three + o.one > 0);
    CHECK(o.waits == 0);
  }
}

TEST_CASE("profile: workloads keeps only the named cgroup and what is below it, labelled",
          "[profile][cgroup]") {
  test::TestCgroup named("profile");
  test::TestCgroup inner(named, "inner");
  MetricStore metrics;
  profiling::ProfileStore store;
  auto tracer = test::start_tracer(
      metrics, "profile",
      "    frequency: 997\n    cgroup: true\n    workloads: [\"" + named.label() + "\"]\n", &store);
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  // The same workload at once inside (in a cgroup below the named one) and outside.
  const pid_t inside = inner.spawn([] {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    execl(PROFILE_WORKLOAD_FP, PROFILE_WORKLOAD_FP, "300", "5", static_cast<char*>(nullptr));
    _exit(127);
  });
  const WorkloadRun outside = run_workload(PROFILE_WORKLOAD_FP);
  int status = 0;
  REQUIRE(waitpid(inside, &status, 0) == inside);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(store.cut());
  const ProfileWindow w = store.window(from, profiling::Clock::now());
  const Observed in = observe(w, inside), out = observe(w, outside.pid);
  INFO("inside:" << in.stacks << "\noutside:" << out.stacks);
  CHECK(in.three + in.one > 0);
  CHECK(in.waits == 5);
  CHECK(out.three + out.one == 0);
  CHECK(out.waits == 0);
  // Nothing from anywhere else, and the workload labels name the cgroup the thread ran in.
  std::set<std::string> cgroups;
  for (const auto& s : w.samples) cgroups.insert(s.workload.cgroup);
  CHECK(cgroups == std::set<std::string>{inner.label()});
}

TEST_CASE("profile: perf record on the same workload agrees on the top functions",
          "[profile][external]") {
  MetricStore metrics;
  profiling::ProfileStore store;
  auto tracer = test::start_tracer(metrics, "profile", "    frequency: 997\n", &store);
  const std::string data = "/tmp/emd-perf-" + std::to_string(getpid()) + ".data";
  REQUIRE(store.cut());
  const auto from = profiling::Clock::now();
  // perf runs the workload itself: its samples are of that process alone.
  const std::string recorded = test::run_capture("perf record -F 997 -g -o " + data + " -- " +
                                                 std::string(PROFILE_WORKLOAD_FP) + " 2000 5 2>&1");
  REQUIRE(store.cut());
  const ProfileWindow w = store.window(from, profiling::Clock::now());
  const std::string report = test::run_capture(
      "perf report -i " + data +
      " --stdio --no-children --sort sym -g none --comm profile_workloa 2>/dev/null");
  std::remove(data.c_str());
  INFO("perf record: " << recorded << "\nperf report:\n" << report.substr(0, 2000));
  // perf's leaf functions, heaviest first: "    74.90%  [.] hot_three".
  const std::regex row(R"(([0-9.]+)%\s+\[\.\]\s+(\S+))");
  std::vector<std::pair<std::string, double>> theirs;
  for (auto it = std::sregex_iterator(report.begin(), report.end(), row);
       it != std::sregex_iterator(); ++it) {
    theirs.emplace_back((*it)[2], std::stod((*it)[1]));
  }
  REQUIRE(theirs.size() >= 2);
  CHECK(theirs[0].first == "hot_three");
  CHECK(theirs[1].first == "hot_one");
  const double their_share = theirs[0].second / (theirs[0].second + theirs[1].second);
  // Ours, over the same process (the only one with that name).
  std::uint64_t three = 0, one = 0;
  for (const auto& s : w.samples) {
    if (s.comm != "profile_workloa" || s.kind != SampleKind::OnCpu) continue;
    const Frame* leaf = leaf_user_frame(w, s.stack);
    if (leaf && leaf->function == "hot_three") three += s.count;
    if (leaf && leaf->function == "hot_one") one += s.count;
  }
  REQUIRE(three + one > 0);
  const double our_share = static_cast<double>(three) / static_cast<double>(three + one);
  INFO("hot_three's share: ours " << our_share << " (" << three << " and " << one
                                  << " samples), perf's " << their_share);
  CHECK(std::abs(our_share - their_share) < 0.05);
}
