// Each tracer's drain against tables that stand in for its kernel maps (map_tables.h): the
// values per CPU summed, only what was added since the last drain counted, and each key
// decoded into the labels an operator sees. No root and no kernel needed.
#include <linux/types.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>

#include "../metrics_lookup.h"
#include "ebpf_metricsd/base/cgroup_names.h"
#include "ebpf_metricsd/daemon/config.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "map_tables.h"

// clang-format off
#include "block_io.h"
#include "common/stacks.h"
#include "kmalloc.h"
#include "net_xmit_latency.h"
#include "offcpu_time.h"
#include "oom_kills.h"
#include "page_cache.h"
#include "page_faults.h"
#include "runqueue_latency.h"
#include "softirq_latency.h"
#include "syscall_latency.h"
#include "tcp_connect_latency.h"
// clang-format on

using namespace ebpf_metricsd;
using test::Labels;

namespace {

// Every hook kind attaches everywhere: tp_btf is chosen.
class AnyHook final : public HookProber {
 public:
  bool can_attach(HookKind kind, const std::string&) override { return kind != HookKind::Fentry; }
};

// A tracer built as the daemon builds it, its maps the tables'.
struct DryTracer {
  test::MapTables tables;
  MetricStore store;
  std::unique_ptr<MetricScope> scope;
  std::unique_ptr<Tracer> tracer;
  DryTracer(const std::string& name, const std::string& options = "") {
    const Config cfg =
        parse_config("tracers:\n  " + name + ":\n    enabled: true\n" + options, "test.yaml");
    for (const auto& tc : cfg.tracers) {
      if (tc.name != name) continue;
      scope = std::make_unique<MetricScope>(store, name);
      AnyHook prober;
      tracer = build_tracer(tc, *scope, prober);
    }
    REQUIRE(tracer);
  }
  ~DryTracer() { tracer.reset(); }
  void drain() { tracer->drain(); }
  double counter(const std::string& metric, const Labels& labels) const {
    return test::counter_value(store, metric, labels);
  }
  double gauge(const std::string& metric, const Labels& labels) const {
    return test::gauge_value(store, metric, labels);
  }
  std::uint64_t count(const std::string& metric, const Labels& labels) const {
    return test::histogram_count(store, metric, labels);
  }
  double sum(const std::string& metric, const Labels& labels) const {
    return test::histogram_sum(store, metric, labels);
  }
  bool has(const std::string& metric, const Labels& labels) const {
    const auto fams = test::collect(store);
    return test::find_series(fams, metric, labels) != nullptr;
  }
};

// A histogram value of `slots` slots with `n` samples in slot `slot` and `sum_ns`.
template <class Hist>
Hist hist(std::size_t slot, std::uint64_t n, std::uint64_t sum_ns) {
  Hist h{};
  h.slots[slot] = n;
  h.sum = sum_ns;
  return h;
}

// The id of the cgroup2 root, which is named "/".
std::uint64_t root_cgroup_id() {
  struct stat st {};
  const std::string root = cgroup2_mount();
  return !root.empty() && stat(root.c_str(), &st) == 0 ? st.st_ino : 0;
}

}  // namespace

TEST_CASE("syscall_latency: values summed over CPUs, deltas only, syscalls by name") {
  DryTracer t("syscall_latency", "    per_syscall: [getpid]\n");
  const std::uint32_t getpid = 39, getppid = 110;
  // Slot 31: (0.5, 1] s; the sum in ns.
  t.tables.set("hists", getpid, hist<syscall_latency_hist>(31, 2, 1'500'000'000), 0);
  t.tables.set("hists", getpid, hist<syscall_latency_hist>(31, 3, 2'500'000'000), 2);
  t.tables.set("hists", getppid, hist<syscall_latency_hist>(30, 7, 3'500'000'000), 1);
  t.drain();
  const std::string m = "ebpf_syscall_latency_seconds";
  CHECK(t.count(m, {{"syscall", "getpid"}}) == 5);
  CHECK(t.sum(m, {{"syscall", "getpid"}}) == Approx(4.0));
  // Not among per_syscall: counted as "other".
  CHECK(t.count(m, {{"syscall", "other"}}) == 7);
  CHECK_FALSE(t.has(m, {{"syscall", "getppid"}}));
  // The kernel side only adds: the next drain counts what came since.
  t.tables.set("hists", getpid, hist<syscall_latency_hist>(31, 4, 3'500'000'000), 2);
  t.drain();
  t.drain();
  CHECK(t.count(m, {{"syscall", "getpid"}}) == 6);
  CHECK(t.count(m, {{"syscall", "other"}}) == 7);
}

TEST_CASE("syscall_latency with cgroup: the workload labels of the key's cgroup") {
  DryTracer t("syscall_latency", "    per_syscall: all\n    cgroup: true\n");
  const std::uint64_t root = root_cgroup_id();
  REQUIRE(root != 0);
  t.tables.set("hists_by_cgroup", syscall_latency_cgroup_key{root, 0, 0},
               hist<syscall_latency_hist>(20, 1, 1000), 1);
  // A cgroup that does not exist (gone before it was ever named).
  t.tables.set("hists_by_cgroup", syscall_latency_cgroup_key{~0ULL - 1, 1, 0},
               hist<syscall_latency_hist>(20, 2, 1000), 0);
  t.drain();
  const std::string m = "ebpf_syscall_latency_seconds";
  CHECK(t.count(m, {{"syscall", "read"}, {"cgroup", "/"}, {"pod", ""}, {"container", ""}}) == 1);
  CHECK(t.count(m, {{"syscall", "write"}, {"cgroup", "unknown"}, {"pod", ""}, {"container", ""}}) ==
        2);
}

TEST_CASE("runqueue_latency unlabelled; offcpu_time by comm; context switches by kind") {
  {
    DryTracer t("runqueue_latency");
    const std::uint32_t only = 0;
    t.tables.set("runq_hist", only, hist<emd_task_hist>(25, 10, 100'000), 0);
    t.tables.set("runq_hist", only, hist<emd_task_hist>(25, 5, 50'000), 1);
    t.drain();
    CHECK(t.count("ebpf_runqueue_latency_seconds", {}) == 15);
  }
  DryTracer t("offcpu_time", "    comm: true\n");
  emd_task_key nginx{}, sleeper{};
  std::strcpy(nginx.comm, "nginx");
  // A comm of the kernel's full 15 characters, and one cut inside a UTF-8 character.
  std::memcpy(sleeper.comm, "sleeper-\xc3", 9);
  t.tables.set("offcpu_hist_labelled", nginx, hist<emd_task_hist>(40, 3, 3'000'000'000), 0);
  t.tables.set("offcpu_hist_labelled", sleeper, hist<emd_task_hist>(40, 1, 1'000'000'000), 1);
  const std::uint32_t voluntary = OFFCPU_SWITCH_VOLUNTARY, involuntary = OFFCPU_SWITCH_INVOLUNTARY;
  t.tables.set("switches", voluntary, std::uint64_t{9}, 0);
  t.tables.set("switches", voluntary, std::uint64_t{1}, 2);
  t.tables.set("switches", involuntary, std::uint64_t{4}, 1);
  t.drain();
  CHECK(t.count("ebpf_offcpu_seconds", {{"comm", "nginx"}}) == 3);
  CHECK(t.count("ebpf_offcpu_seconds", {{"comm", "sleeper-\xef\xbf\xbd"}}) == 1);
  CHECK(t.counter("ebpf_context_switches_total", {{"kind", "voluntary"}}) == 10);
  CHECK(t.counter("ebpf_context_switches_total", {{"kind", "involuntary"}}) == 4);
}

TEST_CASE("block_io: a queue slot's series by its disk's name, others by name; ops") {
  DryTracer t("block_io");
  blockio_queue q{};
  std::strcpy(q.disk, "vda");
  const std::uint32_t slot = 5;
  t.tables.set("queues", slot, q);
  blockio_value v{};
  v.slots[22] = 4;
  v.sum = 4000;
  v.bytes = 4 * 4096;
  t.tables.set("slot_series", slot * BLOCKIO_OPS + BLOCKIO_OP_WRITE, v, 0);
  t.tables.set("slot_series", slot * BLOCKIO_OPS + BLOCKIO_OP_WRITE, v, 1);
  blockio_key loop{};
  std::strcpy(loop.disk, "loop7");
  loop.op = BLOCKIO_OP_DISCARD;
  t.tables.set("series", loop, v, 2);
  t.drain();
  const std::string lat = "ebpf_block_io_latency_seconds", bytes = "ebpf_block_io_bytes_total";
  CHECK(t.count(lat, {{"device", "vda"}, {"op", "write"}}) == 8);
  CHECK(t.counter(bytes, {{"device", "vda"}, {"op", "write"}}) == 8 * 4096);
  CHECK(t.count(lat, {{"device", "loop7"}, {"op", "discard"}}) == 4);
  CHECK_FALSE(t.has(lat, {{"device", "vda"}, {"op", "read"}}));
}

TEST_CASE("block_io: the requests held in flight, by disk, from the queue slots and the hash") {
  DryTracer t("block_io");
  blockio_queue q{};
  q.hctx = 0xffff888000001000;
  std::strcpy(q.disk, "vda");
  q.ts[0] = 100;
  q.ts[7] = 200;
  q.ts[255] = 300;
  const std::uint32_t slot = 9;
  t.tables.set("queues", slot, q);
  blockio_queue unclaimed{};  // no hardware queue: its stamps are not read
  std::strcpy(unclaimed.disk, "vdb");
  unclaimed.ts[1] = 5;
  t.tables.set("queues", std::uint32_t{10}, unclaimed);
  blockio_stamp st{};
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // the kernel's clock: not old enough to be swept
  st.ts = static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  std::strcpy(st.disk, "loop7");
  t.tables.set("issued", std::uint64_t{0xffff888000002000}, st);
  t.drain();
  const std::string m = "ebpf_block_io_requests_in_flight";
  CHECK(t.gauge(m, {{"device", "vda"}}) == 3);
  CHECK(t.gauge(m, {{"device", "loop7"}}) == 1);
  CHECK_FALSE(t.has(m, {{"device", "vdb"}}));
  // Completed since: the disk reads 0, not its last value.
  q.ts[0] = q.ts[7] = q.ts[255] = 0;
  t.tables.set("queues", slot, q);
  t.drain();
  CHECK(t.has(m, {{"device", "vda"}}));
  CHECK(t.gauge(m, {{"device", "vda"}}) == 0);
  CHECK(t.gauge(m, {{"device", "loop7"}}) == 1);
}

TEST_CASE("net_xmit_latency: a device slot's series by its interface, others by name") {
  DryTracer t("net_xmit_latency");
  netxmit_dev dev{};
  std::strcpy(dev.ifname, "eth0");
  const std::uint32_t slot = 12;
  t.tables.set("devs", slot, dev);
  netxmit_value v{};
  v.slots[10] = 2;
  v.packets = 3;  // one packet untimed: queued before the tracer started
  v.bytes = 1500 * 3;
  t.tables.set("dev_series", slot, v, 1);
  netxmit_key other{};
  std::strcpy(other.ifname, "veth9");
  t.tables.set("series", other, v, 0);
  t.drain();
  CHECK(t.count("ebpf_net_xmit_queue_latency_seconds", {{"interface", "eth0"}}) == 2);
  CHECK(t.counter("ebpf_net_xmit_packets_total", {{"interface", "eth0"}}) == 3);
  CHECK(t.counter("ebpf_net_xmit_bytes_total", {{"interface", "veth9"}}) == 4500);
}

TEST_CASE("softirq_latency: runs, latency and run time by vector") {
  DryTracer t("softirq_latency");
  softirq_stats rx{};
  rx.entries = 6;
  rx.latency[15] = 5;  // one run's raise was not seen
  rx.latency_sum = 5000;
  rx.runtime[18] = 6;
  rx.runtime_sum = 60000;
  const std::uint32_t net_rx = 3, rcu = 9;
  t.tables.set("stats", net_rx, rx, 0);
  t.tables.set("stats", rcu, rx, 2);
  t.drain();
  CHECK(t.counter("ebpf_softirqs_total", {{"vector", "net_rx"}}) == 6);
  CHECK(t.count("ebpf_softirq_latency_seconds", {{"vector", "net_rx"}}) == 5);
  CHECK(t.count("ebpf_softirq_runtime_seconds", {{"vector", "rcu"}}) == 6);
  CHECK(t.sum("ebpf_softirq_runtime_seconds", {{"vector", "rcu"}}) == Approx(60e-6));
  CHECK(t.counter("ebpf_softirqs_total", {{"vector", "timer"}}) == 0);
}

TEST_CASE("kmalloc: totals, sizes in bytes, slab caches by name") {
  DryTracer t("kmalloc", "    caches: true\n");
  const std::uint32_t only = 0;
  t.tables.set("totals", only, kmalloc_totals{10, 8, 1000, 1280}, 0);
  t.tables.set("totals", only, kmalloc_totals{5, 5, 500, 640}, 1);
  kmalloc_hist sizes{};
  sizes.slots[8] = 15;  // (64, 128] bytes
  sizes.sum = 1500;
  t.tables.set("sizes", only, sizes, 0);
  kmalloc_cache_key dentry{};
  std::strcpy(dentry.name, "dentry");
  t.tables.set("caches", dentry, kmalloc_cache_counts{3, 1}, 2);
  t.drain();
  CHECK(t.counter("ebpf_kmalloc_calls_total", {}) == 15);
  CHECK(t.counter("ebpf_kfree_calls_total", {}) == 13);
  CHECK(t.counter("ebpf_kmalloc_bytes_total", {{"kind", "requested"}}) == 1500);
  CHECK(t.counter("ebpf_kmalloc_bytes_total", {{"kind", "allocated"}}) == 1920);
  CHECK(t.count("ebpf_kmalloc_size_bytes", {}) == 15);
  CHECK(t.counter("ebpf_kmem_cache_alloc_calls_total", {{"cache", "dentry"}}) == 3);
  CHECK(t.counter("ebpf_kmem_cache_free_calls_total", {{"cache", "dentry"}}) == 1);
}

TEST_CASE("tcp_connect_latency and page_faults: families and fault types") {
  {
    DryTracer t("tcp_connect_latency");
    const std::uint32_t v6 = TCPCONN_IPV6;
    t.tables.set("latency", v6, hist<tcpconn_hist>(20, 2, 2000), 1);
    t.tables.set("failures", v6, std::uint64_t{1}, 0);
    t.drain();
    CHECK(t.count("ebpf_tcp_connect_latency_seconds", {{"family", "ipv6"}}) == 2);
    CHECK(t.counter("ebpf_tcp_connect_failures_total", {{"family", "ipv6"}}) == 1);
  }
  DryTracer t("page_faults");
  const std::uint32_t minor = PAGE_FAULT_MINOR, major = PAGE_FAULT_MAJOR;
  t.tables.set("faults", minor, std::uint64_t{100}, 0);
  t.tables.set("faults", minor, std::uint64_t{50}, 2);
  t.tables.set("faults", major, std::uint64_t{2}, 1);
  t.drain();
  CHECK(t.counter("ebpf_page_faults_total", {{"type", "minor"}}) == 150);
  CHECK(t.counter("ebpf_page_faults_total", {{"type", "major"}}) == 2);
}

TEST_CASE("page_cache: accesses, misses and pages dirtied, by workload when asked") {
  {
    DryTracer t("page_cache");
    const std::uint32_t only = 0;
    t.tables.set("totals", only, page_cache_totals{100, 7, 3}, 0);
    t.tables.set("totals", only, page_cache_totals{50, 1, 0}, 2);
    t.drain();
    CHECK(t.counter("ebpf_page_cache_accesses_total", {}) == 150);
    CHECK(t.counter("ebpf_page_cache_misses_total", {}) == 8);
    CHECK(t.counter("ebpf_page_cache_dirtied_total", {}) == 3);
  }
  DryTracer t("page_cache", "    cgroup: true\n");
  const std::uint64_t root = root_cgroup_id();
  REQUIRE(root != 0);
  t.tables.set("totals_by_cgroup", root, page_cache_totals{9, 2, 1}, 1);
  t.drain();
  const Labels labels = {{"cgroup", "/"}, {"pod", ""}, {"container", ""}};
  CHECK(t.counter("ebpf_page_cache_accesses_total", labels) == 9);
  CHECK(t.counter("ebpf_page_cache_misses_total", labels) == 2);
}

TEST_CASE("oom_kills: by the victim's cgroup, or its parent's once the victim's is gone") {
  DryTracer t("oom_kills");
  const std::uint64_t root = root_cgroup_id();
  REQUIRE(root != 0);
  const std::uint64_t gone = ~0ULL - 7;
  t.tables.set("kills", oom_key{root, 0}, std::uint64_t{1}, 0);
  t.tables.set("kills", oom_key{gone, root}, std::uint64_t{1}, 1);
  t.tables.set("kills", oom_key{gone - 1, 0}, std::uint64_t{1}, 1);
  t.drain();
  const std::string m = "ebpf_oom_kills_total";
  CHECK(t.counter(m, {{"cgroup", "/"}, {"pod", ""}, {"container", ""}}) == 2);
  CHECK(t.counter(m, {{"cgroup", "unknown"}, {"pod", ""}, {"container", ""}}) == 1);
}

TEST_CASE("drops: a tracer's reasons and the stacks its object could not keep, by name") {
  DryTracer t("offcpu_time", "    slow: {threshold: 10ms}\n");
  const std::uint32_t exiting = OFFCPU_DROP_SLOW_EXITING, collision = EMD_STACK_DROP_COLLISION;
  t.tables.set("drops", exiting, std::uint64_t{2}, 0);
  t.tables.set("emd_stack_drops", collision, std::uint64_t{3}, 1);
  t.drain();
  const std::string m = "ebpf_metricsd_dropped_events_total";
  CHECK(t.counter(m, {{"tracer", "offcpu_time"}, {"reason", "slow_exiting"}}) == 2);
  CHECK(t.counter(m, {{"tracer", "offcpu_time"}, {"reason", "stack_collision"}}) == 3);
  CHECK(t.has(m, {{"tracer", "offcpu_time"}, {"reason", "stack_truncated"}}));
}

TEST_CASE("labelled maps: an idle entry of a gone cgroup is retired after it was counted") {
  DryTracer t("page_faults", "    cgroup: true\n");
  const std::uint64_t gone = ~0ULL - 3;
  const page_fault_cgroup_key key{gone, PAGE_FAULT_MINOR, 0};
  t.tables.set("faults_by_cgroup", key, std::uint64_t{4}, 0);
  t.drain();
  const Labels labels = {{"type", "minor"}, {"cgroup", "unknown"}, {"pod", ""}, {"container", ""}};
  CHECK(t.counter("ebpf_page_faults_total", labels) == 4);
  CHECK(t.tables.has("faults_by_cgroup", key));  // changed this drain: kept
  t.drain();
  CHECK_FALSE(t.tables.has("faults_by_cgroup", key));  // idle, its cgroup gone: retired
  CHECK(t.counter("ebpf_page_faults_total", labels) == 4);
}
