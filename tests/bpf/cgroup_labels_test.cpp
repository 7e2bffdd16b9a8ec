// `cgroup: true` on every tracer whose events have an owner: a workload runs in a process
// born in a cgroup the test makes, and the series of that cgroup count exactly what it did
// (the kernel's own accounting of the process where there is one).
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "../cgroup_fixture.h"
#include "../kernel_fixtures.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "../workloads.h"
#include "ebpf_metricsd/core/tracer_set.h"
#include "sched_oracle.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

const std::string kHooks[] = {"auto", "raw_tp"};

// The label set of a series of cgroup `cg` with the tracer's own labels `own`.
test::Labels in_cgroup(const test::TestCgroup& cg, test::Labels own = {}) {
  own["cgroup"] = cg.label();
  own["pod"] = "";
  own["container"] = "";
  return own;
}

}  // namespace

TEST_CASE("syscall_latency by cgroup: the calls of a process in a test cgroup", "[cgroup]") {
  const std::string hook = GENERATE(from_range(std::begin(kHooks), std::end(kHooks)));
  INFO("hook " << hook);
  test::TestCgroup cg("syscall");
  MetricStore store;
  auto tracer =
      test::start_tracer(store, "syscall_latency",
                         "    hook: " + hook + "\n    cgroup: true\n    per_syscall: [getppid]\n");
  constexpr long kCalls = 5000;
  tracer->drain();
  const test::CountedLosses losses(store, "syscall_latency");
  cg.run([] { workload::getppid_calls(kCalls); });
  tracer->drain();
  // Every call, but those whose program the kernel skipped (a task preempted inside the
  // program on the same CPU, under a loaded host) and those it found no room for, each counted.
  const auto labels = in_cgroup(cg, {{"syscall", "getppid"}});
  const std::uint64_t counted =
      test::histogram_count(store, "ebpf_syscall_latency_seconds", labels);
  INFO(losses.text());
  CHECK(counted <= kCalls);
  CHECK(counted + losses.total() >= kCalls);
  // Nothing of the test process itself (it is not in that cgroup) lands there.
  tracer->drain();
  workload::getppid_calls(100);
  tracer->drain();
  CHECK(test::histogram_count(store, "ebpf_syscall_latency_seconds", labels) == counted);
}

TEST_CASE("page_faults by cgroup: equal to the faults the kernel accounted to the process",
          "[cgroup]") {
  test::TestCgroup cg("faults");
  MetricStore store;
  auto tracer = test::start_tracer(store, "page_faults", "    cgroup: true\n");
  constexpr long kPages = 3000;
  const rusage ru = cg.run([] { workload::touch_anon_pages(kPages); });
  tracer->drain();
  const double minor =
      test::counter_value(store, "ebpf_page_faults_total", in_cgroup(cg, {{"type", "minor"}}));
  const double major =
      test::counter_value(store, "ebpf_page_faults_total", in_cgroup(cg, {{"type", "major"}}));
  INFO("minor " << minor << " major " << major << " | rusage minor " << ru.ru_minflt << " major "
                << ru.ru_majflt);
  CHECK(minor >= kPages);
  CHECK(minor == static_cast<double>(ru.ru_minflt));
  CHECK(major == static_cast<double>(ru.ru_majflt));
}

TEST_CASE("tcp_connect_latency by cgroup: the connecting process's cgroup, taken at SYN_SENT",
          "[cgroup]") {
  const std::string hook = GENERATE(from_range(std::begin(kHooks), std::end(kHooks)));
  INFO("hook " << hook);
  test::TestCgroup cg("tcp");
  MetricStore store;
  auto tracer = test::start_tracer(store, "tcp_connect_latency",
                                   "    hook: " + hook + "\n    cgroup: true\n");
  // A listener of the test process (outside the cgroup) and a bound port nobody listens on.
  const auto bound = [](bool listening) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    if (listening) REQUIRE(listen(fd, 512) == 0);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    return std::make_pair(fd, a);
  };
  const auto [lfd, open_addr] = bound(true);
  const auto [cfd, closed_addr] = bound(false);
  constexpr long kConnects = 60, kRefused = 15;
  cg.run([&, open = open_addr, closed = closed_addr] {
    workload::tcp_connects(open, kConnects);
    workload::tcp_refused_connects(closed, kRefused);
  });
  tracer->drain();
  const auto labels = in_cgroup(cg, {{"family", "ipv4"}});
  CHECK(test::histogram_count(store, "ebpf_tcp_connect_latency_seconds", labels) == kConnects);
  CHECK(test::counter_value(store, "ebpf_tcp_connect_failures_total", labels) == kRefused);
  close(lfd);
  close(cfd);
}

TEST_CASE("net_xmit_latency by cgroup: the sending socket's cgroup", "[cgroup]") {
  const std::string hook = GENERATE(from_range(std::begin(kHooks), std::end(kHooks)));
  INFO("hook " << hook);
  test::VethPair veth;
  test::TestCgroup cg("xmit");
  MetricStore store;
  auto tracer =
      test::start_tracer(store, "net_xmit_latency", "    hook: " + hook + "\n    cgroup: true\n");
  constexpr long kPackets = 200;
  constexpr std::size_t kPayload = 64;
  cg.run([] {
    const int fd = socket(AF_INET, SOCK_DGRAM, 0);  // made in the cgroup: the socket's owner
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    if (fd < 0 || inet_pton(AF_INET, "169.254.77.2", &to.sin_addr) != 1)
      throw std::runtime_error("socket");
    workload::udp_sends(fd, to, kPackets, kPayload);
    close(fd);
  });
  tracer->drain();
  const auto labels = in_cgroup(cg, {{"interface", veth.host()}});
  constexpr double kFrame = 14 + 20 + 8 + kPayload;
  CHECK(test::counter_value(store, "ebpf_net_xmit_packets_total", labels) == kPackets);
  CHECK(test::counter_value(store, "ebpf_net_xmit_bytes_total", labels) == kPackets * kFrame);
  CHECK(test::histogram_count(store, "ebpf_net_xmit_queue_latency_seconds", labels) ==
        static_cast<std::uint64_t>(kPackets));
}

TEST_CASE("block_io by cgroup: direct I/O of a process in a test cgroup", "[cgroup]") {
  const std::string hook = GENERATE(from_range(std::begin(kHooks), std::end(kHooks)));
  INFO("hook " << hook);
  test::LoopDevice loop;
  test::TestCgroup cg("block");
  // Where the v2 hierarchy has the io controller, requests are charged to the cgroup when
  // it is enabled for it; elsewhere (hybrid hosts: io on v1) the issuing task names it.
  // Either way the owner is the test cgroup.
  const std::string control = cgroup2_mount() + "/cgroup.subtree_control";
  const bool io_v2 =
      test::read_file(cgroup2_mount() + "/cgroup.controllers").find("io") != std::string::npos;
  const bool io_was_on = test::read_file(control).find("io") != std::string::npos;
  struct Restore {
    std::string file;
    bool on;
    ~Restore() { std::ofstream(file) << (on ? "+io" : "-io"); }
  };
  std::optional<Restore> restore;
  if (io_v2) {
    const bool io_on = GENERATE(false, true);
    INFO("io controller " << (io_on ? "on" : "off") << " for the test cgroup");
    restore.emplace(Restore{control, io_was_on});
    std::ofstream(control) << (io_on ? "+io" : "-io");  // "-io" fails where others use it
  }
  MetricStore store;
  auto tracer = test::start_tracer(store, "block_io", "    hook: " + hook + "\n    cgroup: true\n");
  constexpr long kReads = 150;
  const test::Labels unseen = {{"tracer", "block_io"}, {"reason", "complete_unseen"}};
  tracer->drain();
  const double unseen0 = test::counter_value(store, "ebpf_metricsd_dropped_events_total", unseen);
  const test::Labels device = {{"device", loop.name()}};
  const double held0 = test::gauge_value(store, "ebpf_block_io_requests_in_flight", device);
  const auto s0 = loop.stat();
  cg.run([&] {
    const int fd = open(loop.dev().c_str(), O_RDONLY | O_DIRECT);
    void* buf = nullptr;
    if (fd < 0 || posix_memalign(&buf, 4096, 4096) != 0) throw std::runtime_error("open");
    workload::direct_reads(fd, buf, kReads);
    close(fd);
  });
  tracer->drain();
  const auto s1 = loop.stat();
  const auto labels = in_cgroup(cg, {{"device", loop.name()}, {"op", "read"}});
  const std::uint64_t reads = test::histogram_count(store, "ebpf_block_io_latency_seconds", labels);
  const auto fams = test::collect(store);
  // Requests whose completion the kernel ran no program for (block_io.bpf.c): still held
  // as in flight, or counted as complete_unseen once their tag was issued again. That
  // drop reason is of every disk, so it bounds what this device lost from above.
  const double held = test::gauge_value(store, "ebpf_block_io_requests_in_flight", device) - held0;
  const double lost =
      test::counter_value(store, "ebpf_metricsd_dropped_events_total", unseen) - unseen0;
  const std::uint64_t sysfs = s1[0] - s0[0];
  INFO("reads " << reads << " | sysfs reads " << sysfs << " | held in flight " << held
                << " | complete_unseen " << lost << " | bytes by series:"
                << test::counters_text(fams, "ebpf_block_io_bytes_total",
                                       {{"device", loop.name()}, {"op", "read"}})
                << " | dropped:"
                << test::counters_text(fams, "ebpf_metricsd_dropped_events_total",
                                       {{"tracer", "block_io"}}));
  REQUIRE(sysfs == kReads);
  CHECK(reads <= kReads);
  CHECK(static_cast<double>(reads) + held <= kReads);
  CHECK(static_cast<double>(reads) + held + lost >= kReads);
  CHECK(test::counter_value(store, "ebpf_block_io_bytes_total", labels) == reads * 4096.0);
}

TEST_CASE("page_cache by cgroup: the reading and writing process's cgroup", "[cgroup]") {
  const std::string hook = GENERATE(from_range(std::begin(kHooks), std::end(kHooks)));
  INFO("hook " << hook);
  constexpr long kPages = 256, kDirty = 32;
  const long page = sysconf(_SC_PAGESIZE);
  test::EvictedFile file(kPages, 'z');
  test::TestCgroup cg("cache");
  MetricStore store;
  auto tracer =
      test::start_tracer(store, "page_cache", "    hook: " + hook + "\n    cgroup: true\n");
  const auto labels = in_cgroup(cg);
  const auto value = [&](const char* name) {
    tracer->drain();
    return test::counter_value(store, name, labels);
  };
  const auto read_all = [&](int fd) {
    std::vector<char> buf(static_cast<std::size_t>(page * 16));
    long got = 0;
    ssize_t n;
    for (off_t off = 0; (n = pread(fd, buf.data(), buf.size(), off)) > 0; off += n) got += n;
    if (got != page * kPages) throw std::runtime_error("short read");
  };
  // The child runs code of this test binary: a first child reads a cached copy, so that
  // pages of the binary it faults in (from a disk, or 9p under the kernel matrix) are in
  // the cache before the counted runs.
  {
    char path[] = "/var/tmp/emd-warm-XXXXXX";
    const int warm = mkstemp(path);
    REQUIRE(warm >= 0);
    unlink(path);
    const std::vector<char> data(static_cast<std::size_t>(page * kPages), 'w');
    REQUIRE(write(warm, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
    cg.run([&] { read_all(warm); });
    close(warm);
  }
  const double misses0 = value("ebpf_page_cache_misses_total");
  const double accesses0 = value("ebpf_page_cache_accesses_total");
  const double dirtied0 = value("ebpf_page_cache_dirtied_total");
  cg.run([&] { read_all(file.fd()); });  // cold: every page is read in by this process
  const double misses1 = value("ebpf_page_cache_misses_total") - misses0;
  const double accesses1 = value("ebpf_page_cache_accesses_total") - accesses0;
  cg.run([&] { read_all(file.fd()); });  // warm
  const double misses2 = value("ebpf_page_cache_misses_total") - misses0;
  const double accesses2 = value("ebpf_page_cache_accesses_total") - accesses0;
  cg.run([&] {
    const std::vector<char> data(static_cast<std::size_t>(page * kDirty), 'z');
    if (pwrite(file.fd(), data.data(), data.size(), 0) != static_cast<ssize_t>(data.size()))
      throw std::runtime_error("pwrite");
  });
  const double dirtied = value("ebpf_page_cache_dirtied_total") - dirtied0;
  INFO("cold: misses " << misses1 << " accesses " << accesses1 << "; warm: misses "
                       << misses2 - misses1 << " accesses " << accesses2 - accesses1 << "; dirtied "
                       << dirtied);
  // Every page of the file, plus at most a block or two of file system metadata the read
  // brought in through the block device's own page cache (seen once on 5.10's ext4).
  CHECK(misses1 >= kPages);
  CHECK(misses1 <= kPages + 2);
  CHECK(accesses1 >= kPages);
  CHECK(misses2 == misses1);
  CHECK(accesses2 - accesses1 >= kPages);
  // Every rewritten page, plus at most a block or two of file system metadata the write
  // dirtied in the block device's page cache from the writer's context (the inode's block,
  // when writeback had cleaned it: seen once, 33 of 32, on this machine's file system).
  CHECK(dirtied >= kDirty);
  CHECK(dirtied <= kDirty + 2);
}

TEST_CASE("runqueue_latency and offcpu_time by cgroup: a process that sleeps and wakes",
          "[cgroup]") {
  test::TestCgroup cg("sched");
  MetricStore store;
  auto [runq, offcpu] =
      test::start_scheduler_tracers(store, "    cgroup: true\n", "    cgroup: true\n");
  // The oracle counts the cgroup's returns to a CPU at the same tracepoints. The test writes
  // each byte only once the oracle has seen the child switch out blocked, so there are at
  // least kSleeps returns from blocking, and as many from the run queue (each wakeup); the
  // tracers must count exactly what the oracle counts.
  test::SchedOracle oracle;
  oracle.target_cgroup(cg.id());
  constexpr int kSleeps = 200;
  const rusage ru = cg.run_blocking_reads(kSleeps, [&] { return oracle.blocked_switch_outs(); });
  // The child's last switch-out comes after wait4() returned: a last return that no program
  // saw is found there.
  CHECK(test::wait_until([&] { return oracle.dead_switch_outs() >= 1; }, std::chrono::seconds(60)));
  runq->drain();
  offcpu->drain();
  const auto labels = in_cgroup(cg);
  const std::uint64_t off = test::histogram_count(store, "ebpf_offcpu_seconds", labels);
  const std::uint64_t rq = test::histogram_count(store, "ebpf_runqueue_latency_seconds", labels);
  INFO("off-CPU periods " << off << ", run-queue waits " << rq
                          << " | oracle: " << oracle.returns_from_blocking()
                          << " returns from blocking, " << oracle.returns_from_queue()
                          << " from the run queue | rusage " << ru.ru_nvcsw
                          << " voluntary switches, " << ru.ru_nivcsw << " involuntary | "
                          << oracle.unseen_returns() << " returns unseen at the tracepoint");
  CHECK(off == oracle.returns_from_blocking());
  CHECK(rq == oracle.returns_from_queue());
  // The workload did block, every time: the oracle saw each read's blocked switch-out
  // before the test wrote its byte. A return at which no program ran (the oracle's unseen
  // returns; oracle/sched_oracle.bpf.c says when) is a period neither the tracers nor the
  // oracle can time; offcpu_time counts it as wake_missed. How many there are depends on how
  // busy the machine's other tasks are (6 of 200, and 7 of 50 while a build ran beside): at
  // least half of the reads' returns must be seen, for the exact counts above to prove much.
  CHECK(oracle.blocked_switch_outs() >= kSleeps);
  CHECK(oracle.unseen_returns() * 2 <= kSleeps);
  CHECK(test::wake_missed(store) >= static_cast<double>(oracle.unseen_returns()));
}

namespace {

// max_entries of the newest map called `name` (as the kernel keeps it, 15 bytes) whose id is
// above `after`; 0 when there is none.
std::uint32_t newest_map_entries(const std::string& name, std::uint32_t after,
                                 std::uint32_t* id_out = nullptr) {
  std::uint32_t id = after, found = 0, entries = 0;
  while (bpf_map_get_next_id(id, &id) == 0) {
    const int fd = bpf_map_get_fd_by_id(id);
    if (fd < 0) continue;
    bpf_map_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0 && name.compare(0, 15, info.name) == 0) {
      found = id;
      entries = info.max_entries;
    }
    close(fd);
  }
  if (id_out) *id_out = found;
  return entries;
}

std::uint32_t newest_map_id() {
  std::uint32_t id = 0, next = 0;
  while (bpf_map_get_next_id(id, &next) == 0) id = next;
  return id;
}

bool map_exists(std::uint32_t id) {
  const int fd = bpf_map_get_fd_by_id(id);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::size_t series_with_samples(const MetricStore& store, const std::string& name) {
  std::size_t n = 0;
  for (const auto& f : test::collect(store)) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) n += m.histogram.sample_count > 0 ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE(
    "runqueue_latency and offcpu_time: label_map_entries sizes each one's own map; a reload "
    "that changes runqueue_latency's restarts it alone on a new object, and both count on",
    "[cgroup]") {
  MetricStore store;
  KernelHookProber prober;
  // As the daemon starts, reloads and drains them.
  TracerSet tracers(store, [&](const TracerConfig& config, MetricScope& scope) {
    return build_tracer(config, scope, prober);
  });
  const auto config = [](const std::string& runq_entries) {
    return parse_config(
               "tracers:\n  runqueue_latency:\n    enabled: true\n    cgroup: true\n"
               "    label_map_entries: " +
                   runq_entries + "\n  offcpu_time:\n    enabled: true\n    cgroup: true\n",
               "test.yaml")
        .tracers;
  };
  const std::uint32_t before = newest_map_id();
  REQUIRE(tracers.apply(config("2")).empty());
  std::uint32_t runq_map = 0, offcpu_map = 0;
  CHECK(newest_map_entries("runq_hist_labelled", before, &runq_map) == 2);
  CHECK(newest_map_entries("offcpu_hist_labelled", before, &offcpu_map) == 4096);
  const auto map_full = [&](const char* tracer) {
    return test::counter_value(store, "ebpf_metricsd_dropped_events_total",
                               {{"tracer", tracer}, {"reason", "map_full"}});
  };

  // Three cgroups sleep in turn: run-queue waits of more than two label sets find its map
  // full; off-CPU time has room for every one, exactly as the oracle counts it.
  test::SchedOracle oracle;
  constexpr int kSleeps = 50;

  std::vector<std::unique_ptr<test::TestCgroup>> cgroups;
  std::vector<std::uint64_t> expected_off;
  std::uint64_t unseen_in_last = 0;  // the oracle's unseen returns in the newest cgroup
  const auto run_in_new_cgroup = [&](const std::string& tag, bool drain) {
    cgroups.push_back(std::make_unique<test::TestCgroup>(tag));
    oracle.target_cgroup(cgroups.back()->id());
    const std::uint64_t blocked0 = oracle.returns_from_blocking();
    const std::uint64_t unseen0 = oracle.unseen_returns();
    const std::uint64_t dead0 = oracle.dead_switch_outs();
    cgroups.back()->run_blocking_reads(kSleeps, [&] { return oracle.blocked_switch_outs(); });
    // The child's last switch-out, after wait4() returned, may find a last unseen return.
    CHECK(test::wait_until([&] { return oracle.dead_switch_outs() > dead0; },
                           std::chrono::seconds(60)));
    unseen_in_last = oracle.unseen_returns() - unseen0;
    if (drain) tracers.drain();
    expected_off.push_back(oracle.returns_from_blocking() - blocked0);
  };
  for (const char* tag : {"size-a", "size-b"}) run_in_new_cgroup(tag, true);
  // size-c's periods are still in the maps when runqueue_latency's object is replaced below:
  // the last drain of its old maps must count them, and offcpu_time's next drain.
  run_in_new_cgroup("size-c", false);
  for (std::size_t i = 0; i + 1 < cgroups.size(); ++i) {
    CHECK(test::histogram_count(store, "ebpf_offcpu_seconds", in_cgroup(*cgroups[i])) ==
          expected_off[i]);
  }
  const double voluntary0 =
      test::counter_value(store, "ebpf_context_switches_total", {{"kind", "voluntary"}});

  // A reload gives runqueue_latency room for 65536: it is drained a last time and restarts on
  // a new object, its series kept; offcpu_time runs on with its object.
  const std::uint32_t before_reload = newest_map_id();
  REQUIRE(tracers.apply(config("65536")).empty());
  // Run-queue waits of the three cgroups (and the machine's others) found room for two
  // label sets only.
  {
    const std::size_t runq_series = series_with_samples(store, "ebpf_runqueue_latency_seconds");
    INFO("run-queue series " << runq_series << ", map_full " << map_full("runqueue_latency"));
    CHECK(runq_series <= 2);
    CHECK(map_full("runqueue_latency") > 0);
  }
  CHECK(newest_map_entries("runq_hist_labelled", before_reload) == 65536);
  CHECK(newest_map_entries("offcpu_hist_labelled", before_reload) == 0);  // none made
  CHECK(map_exists(offcpu_map));
  // The old object is gone (the kernel frees its maps after an RCU grace period).
  CHECK(test::wait_until([&] { return !map_exists(runq_map); }, std::chrono::seconds(30)));
  const std::uint64_t queued0 = oracle.returns_from_queue();
  const double runq_full0 = map_full("runqueue_latency");
  run_in_new_cgroup("size-d", true);
  const auto& d = *cgroups.back();
  INFO("after the reload: run-queue map_full " << map_full("runqueue_latency") - runq_full0
                                               << ", off-CPU map_full " << map_full("offcpu_time"));
  CHECK(map_full("offcpu_time") == 0);
  // Counted on: no jump.
  const double voluntary1 =
      test::counter_value(store, "ebpf_context_switches_total", {{"kind", "voluntary"}});
  CHECK(voluntary1 >= voluntary0 + kSleeps);
  CHECK(voluntary1 < voluntary0 + 1e6);
  CHECK(test::histogram_count(store, "ebpf_offcpu_seconds", in_cgroup(d)) == expected_off.back());
  CHECK(test::histogram_count(store, "ebpf_runqueue_latency_seconds", in_cgroup(d)) ==
        oracle.returns_from_queue() - queued0);
  // Every read blocked (the fixture waited for each blocked switch-out); at least half of
  // their returns were seen, as in the test above.
  INFO(unseen_in_last << " of the last cgroup's returns unseen at the tracepoint");
  CHECK(unseen_in_last * 2 <= kSleeps);
  for (std::size_t i = 0; i + 1 < cgroups.size(); ++i) {
    CHECK(test::histogram_count(store, "ebpf_offcpu_seconds", in_cgroup(*cgroups[i])) ==
          expected_off[i]);
  }
  // A cgroup counted before sleeps again: its series grows by exactly the new periods.
  auto& a = *cgroups.front();
  const std::uint64_t blocked0 = oracle.returns_from_blocking();
  oracle.target_cgroup(a.id());
  a.run_blocking_reads(kSleeps, [&] { return oracle.blocked_switch_outs(); });
  tracers.drain();
  CHECK(test::histogram_count(store, "ebpf_offcpu_seconds", in_cgroup(a)) ==
        expected_off.front() + (oracle.returns_from_blocking() - blocked0));
}
