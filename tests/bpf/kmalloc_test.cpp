// kmalloc on the real kernel, against an independent BPF counter of the same tracepoints.
#include <bpf/bpf.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "../metrics_lookup.h"
#include "../workloads.h"
#include "kmalloc_oracle.skel.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

struct OracleCounts {
  std::uint64_t kmallocs, kfrees, requested, cache_calls;
};

OracleCounts read_oracle(const kmalloc_oracle* o) {
  return {__atomic_load_n(&o->bss->kmallocs, __ATOMIC_SEQ_CST),
          __atomic_load_n(&o->bss->kfrees, __ATOMIC_SEQ_CST),
          __atomic_load_n(&o->bss->requested, __ATOMIC_SEQ_CST),
          __atomic_load_n(&o->bss->cache_calls, __ATOMIC_SEQ_CST)};
}

// The tracer's window (from one drain's read of a CPU's counts to the next's) lies between two
// windows of the oracle: the outer, read before the first drain and after the last, and the
// inner, read after the first drain and before the last. Each bound holds but for the events
// in flight at an edge: the two programs of one event run one after the other, and a read
// between them sees the event on one side only; at most one such event per CPU at each of
// the two edges. How long a drain takes (an emulated guest's with 64 possible CPUs, a busy
// host's) moves what lies between the windows, not the bounds.
double edge_events() { return 2.0 * ebpf_metricsd::possible_cpus(); }

// The times the kernel skipped a program because it was already running on that CPU (a
// kmem_cache_free from an interrupt that came while it ran): events the oracle missed.
std::uint64_t recursion_misses(const bpf_program* prog) {
  bpf_prog_info info{};
  std::uint32_t len = sizeof info;
  if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) != 0) return 0;
  return info.recursion_misses;
}

// Opens and attaches the oracle, with its kmalloc_node program where the kernel has that
// tracepoint (before 6.1).
std::unique_ptr<kmalloc_oracle, void (*)(kmalloc_oracle*)> attached_oracle() {
  std::unique_ptr<kmalloc_oracle, void (*)(kmalloc_oracle*)> o(kmalloc_oracle__open(),
                                                               kmalloc_oracle__destroy);
  REQUIRE(o);
  bpf_program__set_autoload(o->progs.oracle_kmalloc_node,
                            libbpf_find_vmlinux_btf_id("kmalloc_node", BPF_TRACE_RAW_TP) > 0);
  REQUIRE(kmalloc_oracle__load(o.get()) == 0);
  REQUIRE(kmalloc_oracle__attach(o.get()) == 0);
  return o;
}

// Whether kmem_cache_alloc passes its slab cache (6.1+), which `caches: true` needs.
bool kernel_passes_caches() {
  const auto types = tracepoint_arg_types("kmem_cache_alloc");
  return types && types->size() >= 3 && (*types)[2] == "struct kmem_cache *";
}

// On a kernel without it, `caches: true` fails to start and says why.
void require_caches_refused() {
  MetricStore store;
  REQUIRE_THROWS_WITH(test::start_tracer(store, "kmalloc", "    caches: true\n"),
                      Catch::Matchers::Contains("third argument of kmem_cache_alloc"));
}

double value(const MetricStore& store, const std::string& name, const test::Labels& l = {}) {
  return test::counter_value(store, name, l);
}

}  // namespace

TEST_CASE("kmalloc counts agree with an independent counter of the same tracepoints", "[kmalloc]") {
  auto oracle = attached_oracle();
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  const bool caches = kernel_passes_caches();
  if (!caches) require_caches_refused();
  INFO("hook " << hook << ", caches " << caches);
  MetricStore store;
  auto tracer = test::start_tracer(
      store, "kmalloc",
      "    caches: " + std::string(caches ? "true" : "false") + "\n    hook: " + hook + "\n");

  constexpr int kReads = 20000;
  // Calls the oracle missed: a kmalloc or kfree from an interrupt that came while the
  // oracle's program of that tracepoint ran on the CPU (our program, another one, runs).
  const auto misses = [&](std::initializer_list<const bpf_program*> progs) {
    std::uint64_t n = 0;
    for (const bpf_program* p : progs) n += recursion_misses(p);
    return n;
  };
  const auto alloc_misses = [&] {
    return misses({oracle->progs.oracle_kmalloc, oracle->progs.oracle_kmalloc_node});
  };
  const auto free_misses = [&] { return misses({oracle->progs.oracle_kfree}); };
  const std::uint64_t am0 = alloc_misses(), fm0 = free_misses();
  // The oracle's outer window, read first and last, and its inner one, read between.
  const OracleCounts o0 = read_oracle(oracle.get());
  tracer->drain();
  const OracleCounts in0 = read_oracle(oracle.get());
  const double calls0 = value(store, "ebpf_kmalloc_calls_total");
  const double frees0 = value(store, "ebpf_kfree_calls_total");
  const double req0 = value(store, "ebpf_kmalloc_bytes_total", {{"kind", "requested"}});
  const double alloc0 = value(store, "ebpf_kmalloc_bytes_total", {{"kind", "allocated"}});
  const double seq0 = value(store, "ebpf_kmem_cache_alloc_calls_total", {{"cache", "seq_file"}});
  const double recursion0 = test::recursion_misses(store, "kmalloc");
  workload::read_proc_files(kReads);
  const OracleCounts in1 = read_oracle(oracle.get());
  tracer->drain();
  const OracleCounts o1 = read_oracle(oracle.get());
  const double alloc_missed = static_cast<double>(alloc_misses() - am0);
  const double free_missed = static_cast<double>(free_misses() - fm0);
  // Calls the kernel skipped of ours, counted (reason recursion): where a task is preempted
  // inside one of the tracer's programs (the newest kernels preempt there), the same
  // program's next run on that CPU, another task's call, is not made.
  const double ours_missed = test::recursion_misses(store, "kmalloc") - recursion0;

  const double calls = value(store, "ebpf_kmalloc_calls_total") - calls0;
  const double frees = value(store, "ebpf_kfree_calls_total") - frees0;
  const double req = value(store, "ebpf_kmalloc_bytes_total", {{"kind", "requested"}}) - req0;
  const double alloc = value(store, "ebpf_kmalloc_bytes_total", {{"kind", "allocated"}}) - alloc0;
  const double seq =
      value(store, "ebpf_kmem_cache_alloc_calls_total", {{"cache", "seq_file"}}) - seq0;
  const double o_calls = static_cast<double>(o1.kmallocs - o0.kmallocs);
  const double o_frees = static_cast<double>(o1.kfrees - o0.kfrees);
  const double o_req = static_cast<double>(o1.requested - o0.requested);
  const double in_req = static_cast<double>(in1.requested - in0.requested);
  const double in_calls = static_cast<double>(in1.kmallocs - in0.kmallocs);
  const double in_frees = static_cast<double>(in1.kfrees - in0.kfrees);
  INFO("kmalloc " << calls << " (oracle " << in_calls << " to " << o_calls << "), kfree " << frees
                  << " (oracle " << in_frees << " to " << o_frees << "), requested bytes " << req
                  << " (oracle " << in_req << " to " << o_req << "), seq_file allocs " << seq
                  << "; the oracle missed " << alloc_missed << " kmallocs, " << free_missed
                  << " kfrees; the kernel skipped " << ours_missed
                  << " runs of the tracer's programs");
  // Every read opened a seq_file (kmem_cache) and kmalloc'ed its buffer: each seen, or
  // skipped by the kernel and counted.
  CHECK(calls + ours_missed >= kReads);
  if (caches) CHECK(seq + ours_missed >= kReads);
  CHECK(alloc >= req);
  // Upper bounds: the outer window, with the calls the oracle missed; lower bounds: the inner
  // one, with the runs of ours the kernel skipped; both but for the events at the edges.
  CHECK(calls <= o_calls + alloc_missed + edge_events());
  CHECK(calls + ours_missed + edge_events() >= in_calls);
  CHECK(frees <= o_frees + free_missed + edge_events());
  CHECK(frees + ours_missed + edge_events() >= in_frees);
  CHECK(req <= o_req + (alloc_missed + edge_events()) * 8192);
  // Bytes: a skipped call's size is not known; within 1% and 200 pages of the inner window.
  CHECK(req >= in_req * 0.99 - 200 * 4096);
}

TEST_CASE("a full cache map counts every call it cannot hold as map_full", "[kmalloc]") {
  if (!kernel_passes_caches()) {
    require_caches_refused();
    WARN("kmem_cache_alloc passes no slab cache on this kernel: per-cache counts are refused");
    return;
  }
  auto oracle = attached_oracle();
  MetricStore store;
  // Room for two slab caches only; the system allocates from dozens.
  auto tracer = test::start_tracer(store, "kmalloc", "    caches: true\n    max_caches: 2\n");
  auto cache_total = [&] {
    double sum = 0;
    for (const auto& fam : test::collect(store)) {
      if (fam.name != "ebpf_kmem_cache_alloc_calls_total" &&
          fam.name != "ebpf_kmem_cache_free_calls_total") {
        continue;
      }
      for (const auto& m : fam.metric) sum += m.counter.value;
    }
    return sum;
  };
  auto series = [&] {
    for (const auto& fam : test::collect(store)) {
      if (fam.name == "ebpf_kmem_cache_alloc_calls_total") return fam.metric.size();
    }
    return std::size_t{0};
  };
  const test::Labels full = {{"tracer", "kmalloc"}, {"reason", "map_full"}};
  const auto oracle_misses = [&] {
    return recursion_misses(oracle->progs.oracle_cache_alloc) +
           recursion_misses(oracle->progs.oracle_cache_free);
  };
  const std::uint64_t m0 = oracle_misses();
  const std::uint64_t o0 = read_oracle(oracle.get()).cache_calls;
  tracer->drain();
  const std::uint64_t in0 = read_oracle(oracle.get()).cache_calls;
  const double counted0 = cache_total();
  const double dropped0 = value(store, "ebpf_metricsd_dropped_events_total", full);
  const double recursion0 = test::recursion_misses(store, "kmalloc");
  workload::read_proc_files(5000);
  const std::uint64_t in1 = read_oracle(oracle.get()).cache_calls;
  tracer->drain();
  const std::uint64_t o1 = read_oracle(oracle.get()).cache_calls;
  const double missed = static_cast<double>(oracle_misses() - m0);
  const double counted = cache_total() - counted0;
  const double dropped = value(store, "ebpf_metricsd_dropped_events_total", full) - dropped0;
  // Runs of the tracer's programs the kernel skipped, counted (reason recursion): a call
  // from an interrupt that came while one of them ran on the CPU (more often where every
  // instruction is emulated), or one made while a preempted program held it.
  const double ours_missed = test::recursion_misses(store, "kmalloc") - recursion0;
  const double o = static_cast<double>(o1 - o0);
  const double in = static_cast<double>(in1 - in0);
  INFO("cache allocs and frees counted "
       << counted << " + map_full " << dropped << " vs oracle " << in << " to " << o << " (+ "
       << missed << " it missed); the kernel "
       << "skipped " << ours_missed << " runs of the tracer's programs");
  CHECK(series() <= 2);
  CHECK(dropped > 0);
  // Nothing vanishes: what the map could not hold is counted as dropped, what the kernel
  // skipped as recursion.
  CHECK(counted + dropped <= o + missed + edge_events());
  CHECK(counted + dropped + ours_missed + edge_events() >= in);
}
