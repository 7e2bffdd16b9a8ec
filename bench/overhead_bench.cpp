// Overhead of each tracer's BPF side, in ns added per workload event, against the floor:
// empty programs on the same hooks. Within a workload, baseline (nothing attached), floor
// and tracer are interleaved round by round in one process, so machine noise hits them
// alike; medians are reported. Prints, per workload: baseline, floor and tracer ns, and
// the ratio (tracer added / floor added). Needs root.
//
//   overhead_bench [--rounds N] [--only WORKLOAD]
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "floors.skel.h"
#include "kernel_fixtures.h"
#include "workloads.h"

using namespace ebpf_metricsd;

namespace {

// Something attached for one measurement; destroying it detaches.
using Attachment = std::shared_ptr<void>;
using Attach = std::function<Attachment()>;

// Runs the workload and returns the number of events it caused.
using Workload = std::function<long()>;

struct Mode {
  std::string name;
  Attach attach;
  std::vector<double> ns_per_event;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double measure(const Workload& work) {
  work();  // warm caches, task storage, map entries
  const auto t0 = std::chrono::steady_clock::now();
  const long events = work();
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - t0;
  return took.count() / static_cast<double>(events);
}

std::shared_ptr<floors> g_floors;

Attach floor_of(std::vector<std::string> progs, bool perf_faults = false) {
  return [progs, perf_faults]() -> Attachment {
    auto links = std::make_shared<std::vector<BpfLink>>();
    for (const auto& p : progs) {
      links->push_back(attach_program(bpf_object__find_program_by_name(g_floors->obj, p.c_str())));
    }
    if (perf_faults) {
      for (int cpu : online_cpus()) {
        links->push_back(
            attach_perf_sw_event(g_floors->progs.floor_fault, PERF_COUNT_SW_PAGE_FAULTS_MIN, cpu));
        links->push_back(
            attach_perf_sw_event(g_floors->progs.floor_fault, PERF_COUNT_SW_PAGE_FAULTS_MAJ, cpu));
      }
    }
    return links;
  };
}

Attach tracer(const std::string& name, MetricStore& store, const std::string& options = "") {
  return [name, &store, options]() -> Attachment {
    const Config cfg =
        parse_config("tracers:\n  " + name + ":\n    enabled: true\n" + options, "bench");
    for (const auto& tc : cfg.tracers) {
      if (tc.name != name) continue;
      struct Held {  // the scope outlives the tracer
        std::unique_ptr<MetricScope> scope;
        std::unique_ptr<Tracer> tracer;
      };
      auto held = std::make_shared<Held>();
      held->scope = std::make_unique<MetricScope>(store, name);
      KernelHookProber prober;
      held->tracer = build_tracer(tc, *held->scope, prober);
      return held;
    }
    throw std::runtime_error("no tracer " + name);
  };
}

// Several attached at once.
Attach together(std::vector<Attach> attaches) {
  return [attaches]() -> Attachment {
    auto all = std::make_shared<std::vector<Attachment>>();
    for (const Attach& a : attaches) all->push_back(a());
    return all;
  };
}

// Each workload returns the number of events it caused.
long getppid_calls() {
  constexpr long n = 300'000;
  workload::getppid_calls(n);
  return n;
}
long pipe_ping_pong() {
  constexpr int rounds = 20'000;
  workload::pipe_ping_pong(rounds);
  return rounds;
}
long touch_pages() {
  constexpr long pages = 20'000;
  workload::touch_anon_pages(pages);
  return pages;
}
long read_proc_files() {
  constexpr long n = 20'000;
  workload::read_proc_files(n);
  return n;
}

// Network and storage: set up once, on first use.
struct Io {
  int listener = -1;
  sockaddr_in listen_addr{};
  std::unique_ptr<test::VethPair> veth;
  int udp = -1;
  sockaddr_in udp_to{};
  std::unique_ptr<test::LoopDevice> loop;
  int loop_fd = -1;
  void* aligned = nullptr;
  int cached_fd = -1;

  Io() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof listen_addr;
    if (bind(listener, reinterpret_cast<sockaddr*>(&listen_addr), len) || listen(listener, 4096) ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&listen_addr), &len)) {
      throw std::runtime_error("listen");
    }
    veth = std::make_unique<test::VethPair>();
    udp = socket(AF_INET, SOCK_DGRAM, 0);
    udp_to.sin_family = AF_INET;
    udp_to.sin_port = htons(9);
    inet_pton(AF_INET, "169.254.77.2", &udp_to.sin_addr);
    loop = std::make_unique<test::LoopDevice>();
    loop_fd = open(loop->dev().c_str(), O_RDONLY | O_DIRECT);
    if (loop_fd < 0 || posix_memalign(&aligned, 4096, 4096)) throw std::runtime_error("loop");
    char path[] = "/var/tmp/emd-bench-XXXXXX";
    cached_fd = mkstemp(path);
    unlink(path);
    std::vector<char> data(256 * 4096, 'z');
    if (write(cached_fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      throw std::runtime_error("write");
    }
  }
  ~Io() {
    close(listener);
    close(udp);
    close(loop_fd);
    close(cached_fd);
    free(aligned);
  }
  // The listener's accept queue must not fill up: drain it.
  void accept_all() {
    for (;;) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK);
      if (fd < 0) break;
      close(fd);
    }
  }
};
Io* g_io = nullptr;

long loopback_connects() {
  constexpr long n = 2'000;
  fcntl(g_io->listener, F_SETFL, O_NONBLOCK);
  for (long done = 0; done < n; done += 500) {
    workload::tcp_connects(g_io->listen_addr, 500);
    g_io->accept_all();
  }
  return n;
}
long veth_udp_sends() {
  constexpr long n = 20'000;
  workload::udp_sends(g_io->udp, g_io->udp_to, n, 100);
  return n;
}
// The loop device reads in a kworker of an unbound workqueue, which may run on either CPU:
// the hand-off between CPUs then varies more than the BPF programs cost. For the block_io
// suite, unbound workqueues are kept on CPU 0 with the benchmark; the mask is restored after.
class UnboundWorkqueuesOnCpu0 {
 public:
  UnboundWorkqueuesOnCpu0() {
    std::ifstream in(kPath);
    std::getline(in, saved_);
    std::ofstream out(kPath);
    out << "1";
    if (!out.flush()) saved_.clear();
  }
  ~UnboundWorkqueuesOnCpu0() {
    if (!saved_.empty()) std::ofstream(kPath) << saved_;
  }

 private:
  static constexpr const char* kPath = "/sys/devices/virtual/workqueue/cpumask";
  std::string saved_;
};

long loop_direct_reads() {
  constexpr long n = 5'000;
  workload::direct_reads(g_io->loop_fd, g_io->aligned, n);
  return n;
}
long cached_reads() {
  constexpr long n = 100'000;
  workload::cached_reads(g_io->cached_fd, n);
  return n;
}

struct Suite {
  std::string name;
  std::string event;
  Workload work;
  std::vector<Mode> modes;  // [0] baseline, [1] floor, then tracers
  int min_rounds = 0;       // noisy workloads need more, shorter rounds
};

void run(Suite& s, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    // Rotate the order every round so no mode always runs first or last.
    for (std::size_t k = 0; k < s.modes.size(); ++k) {
      Mode& m = s.modes[(k + static_cast<std::size_t>(r)) % s.modes.size()];
      Attachment a = m.attach();
      m.ns_per_event.push_back(measure(s.work));
    }
  }
  // "Added" is taken per round against that round's baseline, then the median over rounds:
  // slow drifts of the machine cancel out of each difference.
  const auto added = [&](std::size_t mode) {
    std::vector<double> d;
    for (int r = 0; r < rounds; ++r) {
      d.push_back(s.modes[mode].ns_per_event[r] - s.modes[0].ns_per_event[r]);
    }
    return median(d);
  };
  const double base = median(s.modes[0].ns_per_event);
  const double floor_added = added(1);
  std::printf("%s (ns per %s, median of %d rounds)\n", s.name.c_str(), s.event.c_str(), rounds);
  std::printf("  %-28s %9.1f\n", "baseline", base);
  std::printf("  %-28s %9.1f  added %7.1f\n", s.modes[1].name.c_str(),
              median(s.modes[1].ns_per_event), floor_added);
  for (std::size_t i = 2; i < s.modes.size(); ++i) {
    std::printf("  %-28s %9.1f  added %7.1f  ratio %.2f\n", s.modes[i].name.c_str(),
                median(s.modes[i].ns_per_event), added(i), added(i) / floor_added);
  }
  std::fflush(stdout);
}

}  // namespace

int run_benchmarks(int argc, char** argv) {
  int rounds = 21;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
  }
  g_floors.reset(floors__open_and_load(), floors__destroy);
  if (!g_floors) {
    std::fprintf(stderr, "cannot load the floor programs (root and BPF needed)\n");
    return 1;
  }
  MetricStore store;
  // The raw_tp variants (per-thread state in a pid-keyed hash, as on kernels whose tracing
  // programs have no task storage) declare the same metrics: a store of their own.
  MetricStore raw_store;
  // With cgroup: true the metrics have three more labels: a store of their own too.
  MetricStore labelled_store;
  // With `slow` (events below its threshold: what every event pays): a store of its own.
  MetricStore slow_store;
  // With `slow` walked by frame pointer (no sys_exit hook): a store of its own.
  MetricStore slow_fp_store;
  // The two scheduler tracers at once.
  MetricStore both_store;
  const auto labelled = [&](const std::string& name) -> Mode {
    return {name + " cgroup: true", tracer(name, labelled_store, "    cgroup: true\n"), {}};
  };
  const Attach none = [] { return Attachment(); };
  std::vector<Suite> suites = {
      {"syscall_latency: getppid()",
       "syscall",
       getppid_calls,
       {{"baseline", none, {}},
        {"floor sys_enter+sys_exit", floor_of({"floor_sys_enter", "floor_sys_exit"}), {}},
        {"syscall_latency", tracer("syscall_latency", store), {}},
        {"syscall_latency raw_tp (tid hash)",
         tracer("syscall_latency", raw_store, "    hook: raw_tp\n"),
         {}},
        labelled("syscall_latency"),
        {"syscall_latency slow: 10ms (below it)",
         tracer("syscall_latency", slow_store, "    slow: {threshold: 10ms}\n"),
         {}},
        // What every system call on the host pays for the sys_exit hook that sends block_io's
        // (and tcp_connect_latency's) held events, with nothing held.
        {"block_io slow: 1h (its sys_exit hook, nothing held)",
         tracer("block_io", slow_store, "    slow: {threshold: 1h}\n"),
         {}}}},
      {"runqueue_latency: pipe ping-pong",
       "round trip",
       pipe_ping_pong,
       {{"baseline", none, {}},
        {"floor wakeup(_new)+switch",
         floor_of({"floor_wakeup", "floor_wakeup_new", "floor_switch"}),
         {}},
        {"runqueue_latency", tracer("runqueue_latency", store), {}},
        {"runqueue_latency raw_tp (pid hash)",
         tracer("runqueue_latency", raw_store, "    hook: raw_tp\n"),
         {}},
        labelled("runqueue_latency")}},
      {"offcpu_time: pipe ping-pong",
       "round trip",
       pipe_ping_pong,
       {{"baseline", none, {}},
        {"floor sched_switch", floor_of({"floor_switch"}), {}},
        {"offcpu_time", tracer("offcpu_time", store), {}},
        labelled("offcpu_time"),
        // Each its own object: two sched_switch programs.
        {"runqueue_latency + offcpu_time",
         together({tracer("runqueue_latency", both_store), tracer("offcpu_time", both_store)}),
         {}}}},
      {"page_faults: first touch of anonymous pages",
       "page",
       touch_pages,
       {{"baseline", none, {}},
        {"floor perf_event", floor_of({}, /*perf_faults=*/true), {}},
        {"page_faults", tracer("page_faults", store), {}},
        labelled("page_faults")}},
      {"kmalloc: open+read+close /proc/self/stat",
       "open/read/close",
       read_proc_files,
       {{"baseline", none, {}},
        {"floor kmalloc+kfree", floor_of({"floor_kmalloc", "floor_kfree"}), {}},
        {"kmalloc", tracer("kmalloc", store), {}}}},
      {"tcp_connect_latency: loopback connect+close",
       "connect",
       loopback_connects,
       {{"baseline", none, {}},
        {"floor inet_sock_set_state", floor_of({"floor_inet_sock_set_state"}), {}},
        {"tcp_connect_latency", tracer("tcp_connect_latency", store), {}},
        labelled("tcp_connect_latency"),
        {"tcp_connect_latency slow: 1h, frame_pointers (below it; stack taken at connect)",
         tracer("tcp_connect_latency", slow_fp_store,
                "    slow: {threshold: 1h, unwind: frame_pointers}\n"),
         {}},
        {"tcp_connect_latency slow: 1h, cfi (and the call marked, sys_exit hook)",
         tracer("tcp_connect_latency", slow_store, "    slow: {threshold: 1h}\n"),
         {}}}},
      {"net_xmit_latency: UDP datagram over a veth pair",
       "datagram",
       veth_udp_sends,
       {{"baseline", none, {}},
        {"floor net_dev_queue+xmit", floor_of({"floor_net_dev_queue", "floor_net_dev_xmit"}), {}},
        {"net_xmit_latency", tracer("net_xmit_latency", store), {}},
        labelled("net_xmit_latency")}},
      {"block_io: 4 KiB O_DIRECT read of a loop device",
       "read",
       loop_direct_reads,
       {{"baseline", none, {}},
        {"floor block_rq_issue+complete",
         floor_of({"floor_block_rq_issue", "floor_block_rq_complete"}),
         {}},
        {"block_io", tracer("block_io", store), {}},
        labelled("block_io"),
        {"block_io slow: 1h, frame_pointers (below it; stacks taken at issue)",
         tracer("block_io", slow_fp_store, "    slow: {threshold: 1h, unwind: frame_pointers}\n"),
         {}},
        {"block_io slow: 1h, cfi (and the call marked, sys_exit hook)",
         tracer("block_io", slow_store, "    slow: {threshold: 1h}\n"),
         {}}},
       /*min_rounds=*/61},
      {"page_cache: 4 KiB read of a cached file",
       "read",
       cached_reads,
       {{"baseline", none, {}},
        {"floor 5 page cache hooks",
         floor_of({"floor_get_pages", "floor_map_pages", "floor_filemap_fault",
                   "floor_add_to_page_cache", "floor_dirty_folio"}),
         {}},
        {"page_cache", tracer("page_cache", store), {}},
        labelled("page_cache")}},
  };
  Io io;
  g_io = &io;
  // One CPU for the single-threaded workloads: the comparison is per event, and migrations
  // only add noise. The ping-pong threads inherit it, so every round trip switches.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof set, &set);
  for (auto& s : suites) {
    if (!only.empty() && s.name.find(only) == std::string::npos) continue;
    std::optional<UnboundWorkqueuesOnCpu0> pin;
    if (s.name.rfind("block_io", 0) == 0) pin.emplace();
    run(s, std::max(rounds, s.min_rounds));
  }
  return 0;
}

int main(int argc, char** argv) {
  // Caught here so that the veth pair, the loop device and the workqueue mask are undone.
  try {
    return run_benchmarks(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overhead_bench: %s\n", e.what());
    return 1;
  }
}
