// syscall_latency on the real kernel: the test makes N getppid() calls itself and expects
// the histogram count to grow by N plus at most kOtherCallers.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "../metrics_lookup.h"
#include "../slow_reads.h"
#include "../workloads.h"
#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;
using test::histogram_count;

namespace {

// getppid is called by almost nothing but shells starting up ($PPID); over the few
// milliseconds a burst takes, other processes on the machine add at most a handful.
// 1% of N leaves room for a busy shared machine and still catches any double count.
constexpr std::uint64_t kCalls = 100'000;
constexpr std::uint64_t kOtherCallers = kCalls / 100;

const std::string kMetric = "ebpf_syscall_latency_seconds";

}  // namespace

TEST_CASE("syscall_latency counts every getppid call", "[syscall_latency]") {
  const auto [hook_yaml, expected_hook] = GENERATE(table<std::string, std::string>({
      {"    hook: auto\n    per_syscall: all\n", test::auto_hook_with_task_storage()},
      {"    hook: raw_tp\n    per_syscall: all\n", "raw_tp"},
  }));
  INFO("hook option: " << hook_yaml);
  MetricStore store;
  auto tracer = test::start_tracer(store, "syscall_latency", hook_yaml);
  CHECK(tracer->hook() == expected_hook);

  tracer->drain();
  const std::uint64_t before = histogram_count(store, kMetric, {{"syscall", "getppid"}});
  const test::CountedLosses losses(store, "syscall_latency");
  const double sum0 = test::histogram_sum(store, kMetric, {{"syscall", "getppid"}});
  const auto t0 = std::chrono::steady_clock::now();
  workload::getppid_calls(kCalls);
  const double loop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tracer->drain();
  const std::uint64_t after = histogram_count(store, kMetric, {{"syscall", "getppid"}});
  // Calls whose program the kernel skipped, or found no room for, are counted as such.
  INFO(losses.text());
  CHECK(after - before + losses.total() >= kCalls);
  CHECK(after - before <= kCalls + kOtherCallers);

  const auto fams = test::collect(store);
  const auto* m = test::find_series(fams, kMetric, {{"syscall", "getppid"}});
  REQUIRE(m != nullptr);
  const auto& h = m->histogram;
  // Cumulative buckets never decrease and none exceeds the count (+Inf == count is
  // implied by the serializer writing sample_count as +Inf).
  std::uint64_t prev = 0;
  for (const auto& b : h.bucket) {
    CHECK(b.cumulative_count >= prev);
    prev = b.cumulative_count;
  }
  CHECK(prev <= h.sample_count);
  // More than 0, and no more than the calls had: one thread made them one after another, so
  // their time in the kernel lies within the loop's wall time, at any machine speed. Other
  // processes' calls in the window (at most kOtherCallers) may each have been preempted: 10 ms
  // each, a few scheduler ticks, is allowed for them.
  const double sum = test::histogram_sum(store, kMetric, {{"syscall", "getppid"}}) - sum0;
  INFO("time in getppid " << sum << " s over " << after - before << " calls; the loop took "
                          << loop_s << " s for " << kCalls);
  CHECK(sum > 0);
  CHECK(sum <= loop_s + static_cast<double>(after - before -
                                            std::min<std::uint64_t>(after - before, kCalls)) *
                            10e-3);
}

TEST_CASE("drains racing with the calls lose no increment", "[syscall_latency]") {
  MetricStore store;
  auto tracer = test::start_tracer(store, "syscall_latency",
                                   "    include: [getppid]\n    per_syscall: [getppid]\n");
  tracer->drain();
  const std::uint64_t before = histogram_count(store, kMetric, {{"syscall", "getppid"}});
  const test::CountedLosses losses(store, "syscall_latency");
  std::atomic<bool> done{false};
  std::atomic<int> drains{0};
  // At least kCalls, and on until a few drains have raced with them: a starved machine can
  // run all of kCalls within one drain.
  std::uint64_t calls = 0;
  std::thread caller([&] {
    while (calls < kCalls || drains < 3) {
      workload::getppid_calls(1000);
      calls += 1000;
    }
    done = true;
  });
  while (!done) {
    tracer->drain();
    ++drains;
  }
  caller.join();
  tracer->drain();
  const std::uint64_t got = histogram_count(store, kMetric, {{"syscall", "getppid"}}) - before;
  INFO("calls: " << calls << ", drains while calling: " << drains << ", " << losses.text());
  CHECK(drains > 1);
  CHECK(got + losses.total() >= calls);
  CHECK(got <= calls + calls / 100);  // getppid() of other processes meanwhile
}

TEST_CASE("include and exclude filter in the kernel", "[syscall_latency]") {
  MetricStore store;
  SECTION("include only getppid") {
    auto tracer = test::start_tracer(store, "syscall_latency",
                                     "    include: [getppid]\n    per_syscall: all\n");
    workload::getppid_calls(1000);
    syscall(SYS_getpid);
    tracer->drain();
    CHECK(histogram_count(store, kMetric, {{"syscall", "getppid"}}) >= 1000);
    const auto fams = test::collect(store);
    for (const auto& f : fams) {
      if (f.name != kMetric) continue;
      for (const auto& m : f.metric) CHECK(m.label.at(0).value == "getppid");
    }
  }
  SECTION("exclude getppid") {
    auto tracer = test::start_tracer(store, "syscall_latency",
                                     "    exclude: [getppid]\n    per_syscall: all\n");
    workload::getppid_calls(1000);
    syscall(SYS_getpid);
    tracer->drain();
    // The other callers on the machine are excluded as well: not one getppid may show.
    CHECK(histogram_count(store, kMetric, {{"syscall", "getppid"}}) == 0);
    CHECK(histogram_count(store, kMetric, {{"syscall", "getpid"}}) >= 1);
  }
}

TEST_CASE("syscalls without series of their own are counted as \"other\"", "[syscall_latency]") {
  // Only getppid and getpid are measured; getpid has its own series, getppid is "other".
  MetricStore store;
  auto tracer = test::start_tracer(store, "syscall_latency",
                                   "    include: [getppid, getpid]\n    per_syscall: [getpid]\n");
  tracer->drain();
  const std::uint64_t before = histogram_count(store, kMetric, {{"syscall", "other"}});
  const test::CountedLosses losses(store, "syscall_latency");
  workload::getppid_calls(kCalls);
  syscall(SYS_getpid);
  tracer->drain();
  const std::uint64_t got = histogram_count(store, kMetric, {{"syscall", "other"}}) - before;
  INFO(losses.text());
  CHECK(got + losses.total() >= kCalls);
  CHECK(got <= kCalls + kOtherCallers);
  CHECK(histogram_count(store, kMetric, {{"syscall", "getpid"}}) >= 1);
  CHECK(histogram_count(store, kMetric, {{"syscall", "getppid"}}) == 0);
}

TEST_CASE("syscall numbers outside the table are counted as drops", "[syscall_latency]") {
  MetricStore store;
  auto tracer = test::start_tracer(store, "syscall_latency");
  tracer->drain();
  const test::Labels labels = {{"tracer", "syscall_latency"}, {"reason", "unknown_syscall"}};
  const double before = test::counter_value(store, "ebpf_metricsd_dropped_events_total", labels);
  constexpr int kBogus = 1000;
  for (int i = 0; i < kBogus; ++i) REQUIRE(syscall(100000) == -1);  // ENOSYS, number >= 512
  tracer->drain();
  const double got =
      test::counter_value(store, "ebpf_metricsd_dropped_events_total", labels) - before;
  CHECK(got >= kBogus);
  CHECK(got <= kBogus + kBogus / 100);
}

TEST_CASE(
    "slow syscalls: each at or above the threshold is an exemplar on its bucket, and its "
    "stack names the function that made it",
    "[syscall_latency][slow]") {
  constexpr int kSlowReads = 5;
  MetricStore store;
  profiling::Profiles profiles;
  // The highest limit: other processes' slow reads do not use up the budget.
  auto tracer = test::start_tracer(store, "syscall_latency",
                                   "    per_syscall: all\n    include: [read]\n    slow:\n"
                                   "      threshold: 10ms\n      max_per_second: 1000\n",
                                   &profiles);
  // The reads come from a child: the daemon's own process is never captured.
  test::SlowReader reader(kSlowReads, std::chrono::milliseconds(20));
  const pid_t child = reader.pid();

  const auto ours = test::wait_for_slow_events(
      tracer, profiles, kMetric, kSlowReads,
      [&](const auto& e) { return e.pid == static_cast<std::uint32_t>(child); });
  profiling::SlowEventStore::Query q;
  q.metric = kMetric;
  CHECK(reader.finish() == 0);

  REQUIRE(ours.size() == kSlowReads);
  const auto window = profiles.slow_events().query(q);
  for (const auto& e : ours) {
    INFO("stack " << profiling::stack_id_text(e.stack_id));
    CHECK(e.latency_ns >= 20'000'000);
    CHECK(e.series == std::vector<std::pair<std::string, std::string>>{{"syscall", "read"}});
    REQUIRE(window.stacks.count(e.stack_id) == 1);
    bool named = false;
    for (const auto& f : window.stacks.at(e.stack_id)) {
      named = named || f.function.find("slow_read_in_known_function") != std::string::npos;
    }
    CHECK(named);
  }
  // The bucket of the child's last read carries the newest event kept in it as its
  // exemplar: that read, or a later slow read of another process.
  test::check_bucket_exemplar(store, window, ours.back(),
                              "ebpf_syscall_latency_seconds_bucket{syscall=\"read\",");
  // Nothing was refused by the limit or lost to a full ring.
  const auto fams = test::collect(store);
  test::check_no_drops(fams, "syscall_latency",
                       {"slow_limited", "slow_ring_full", "slow_queue_full"});
}

TEST_CASE(
    "slow syscalls through the C library: the stack names the caller of read(), with and "
    "without frame pointers, up to the thread's start",
    "[syscall_latency][slow][unwind]") {
  // The profile tests' workload: its reader thread blocks in read() called through the C
  // library (whose wrapper keeps no frame) from reader -> read_all -> wait_on_pipe, each read
  // at least 20 ms; built with frame pointers and without, as Debian builds.
  const std::string binary =
      GENERATE(from_range(test::workload_builds(PROFILE_WORKLOAD_FP, PROFILE_WORKLOAD_NOFP)));
  constexpr int kReads = 8;
  MetricStore store;
  profiling::Profiles profiles;
  auto tracer = test::start_tracer(store, "syscall_latency",
                                   "    per_syscall: all\n    include: [read]\n    slow:\n"
                                   "      threshold: 10ms\n      max_per_second: 1000\n",
                                   &profiles);
  // Its main thread burns 2 s of CPU while the reads happen, and it lives on until the test
  // has found their stacks (a guest emulated on a busy host names them seconds later).
  // Gated: its reads start once a walk of it reaches main (test::open_when_walked), so that
  // they are not walked before its mappings are read.
  tracer->drain();
  const double missed0 = test::recursion_misses(store, "syscall_latency");
  test::SpawnedWorkload workload({binary, "2000", std::to_string(kReads), "hold"},
                                 /*gated=*/true);
  const pid_t pid = workload.pid();
  // Its blocking reads, each 20 ms at least: the process's only read(2) calls but the
  // loader's (which take microseconds, unless a busy machine preempts one for 20 ms). The
  // events of the process named by wait_on_pipe must be exactly its reads, each unwound to
  // the thread's start; so the tracer is drained until they are all in (up to a minute).
  const auto user_frames = [](const profiling::SlowEvent& e, const profiling::SlowWindow& w) {
    std::vector<std::string> user;
    for (const auto& f : w.stacks.at(e.stack_id)) {
      if (!f.kernel) user.push_back(f.function);
    }
    return user;
  };
  const auto slow_read = [&](const profiling::SlowEvent& e) {
    return e.pid == static_cast<std::uint32_t>(pid) && e.latency_ns >= 20'000'000;
  };
  const auto found = test::wait_for_slow(
      tracer, profiles, kMetric, kReads,
      [&](const profiling::SlowEvent& e, const profiling::SlowWindow& w) {
        if (!slow_read(e) || w.stacks.count(e.stack_id) != 1) return false;
        const auto user = user_frames(e, w);
        return std::find(user.begin(), user.end(), "wait_on_pipe") != user.end();
      });
  std::vector<std::vector<std::string>> named, others;
  for (const auto& e : found.window.events) {
    if (!slow_read(e)) continue;
    REQUIRE(found.window.stacks.count(e.stack_id) == 1);
    auto user = user_frames(e, found.window);
    (std::find(user.begin(), user.end(), "wait_on_pipe") != user.end() ? named : others)
        .push_back(std::move(user));
  }
  const std::size_t shorter = std::count_if(
      found.window.events.begin(), found.window.events.end(), [&](const profiling::SlowEvent& e) {
        return e.pid == static_cast<std::uint32_t>(pid) && !slow_read(e);
      });
  CHECK(workload.finish() == 0);
  const auto chain_of = [](const std::vector<std::string>& user) {
    std::string chain;
    for (const auto& f : user) chain += f + " <- ";
    return chain;
  };
  for (const auto& user : others) UNSCOPED_INFO("another slow read: " << chain_of(user));
  {
    const auto fams = test::collect(store);
    UNSCOPED_INFO(binary << "; its slow reads found " << named.size() + others.size()
                         << ", its events under 20 ms " << shorter << "; unwinds:"
                         << test::counters_text(fams, "ebpf_metricsd_slow_unwinds_total",
                                                {{"tracer", "syscall_latency"}})
                         << "; dropped:"
                         << test::counters_text(fams, "ebpf_metricsd_dropped_events_total",
                                                {{"tracer", "syscall_latency"}}));
  }
  // A read whose sys_exit program the kernel skipped is counted as a recursion miss: since
  // 7.2 the system call tracepoints run their programs preemptibly, and one preempted inside
  // the program keeps it from running for other threads on that CPU until it resumes (an
  // emulated guest on a busy host preempts its 16 KiB stack copies often).
  const auto missed =
      static_cast<std::size_t>(test::recursion_misses(store, "syscall_latency") - missed0);
  INFO("recursion misses: " << missed);
  CHECK(named.size() <= static_cast<std::size_t>(kReads));
  CHECK(named.size() + missed >= static_cast<std::size_t>(kReads));
  CHECK(named.size() * 2 >= static_cast<std::size_t>(kReads));  // the premise: most were seen
  for (const auto& user : named) {
    INFO("user frames: " << chain_of(user));
    // The wrapper, then the function that called it and its callers, to the thread's start.
    const auto at = [&](const std::string& name) {
      return std::find(user.begin(), user.end(), name) - user.begin();
    };
    REQUIRE(user.size() >= 4);
    CHECK(at("wait_on_pipe") < at("read_all"));
    CHECK(at("read_all") < at("reader"));
    CHECK(at("reader") < at("start_thread"));
    CHECK(at("start_thread") < static_cast<long>(user.size()));
  }
  // Each copy was unwound to the stack's own end.
  const auto fams = test::collect(store);
  const auto* complete = test::find_series(fams, "ebpf_metricsd_slow_unwinds_total",
                                           {{"tracer", "syscall_latency"}, {"result", "complete"}});
  REQUIRE(complete);
  CHECK(complete->counter.value >= static_cast<double>(named.size()));
}
