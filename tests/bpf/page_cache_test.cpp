// page_cache on the real kernel: a file the test evicts, reads twice and rewrites.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "../kernel_fixtures.h"
#include "../metrics_lookup.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

struct Totals {
  double accesses, misses, dirtied;
};

Totals totals(Tracer& t, const MetricStore& store) {
  t.drain();
  return {test::counter_value(store, "ebpf_page_cache_accesses_total", {}),
          test::counter_value(store, "ebpf_page_cache_misses_total", {}),
          test::counter_value(store, "ebpf_page_cache_dirtied_total", {})};
}

// Reads the whole file in 16-page read() calls.
void read_all(int fd, long page, long pages) {
  std::vector<char> buf(static_cast<std::size_t>(page * 16));
  REQUIRE(lseek(fd, 0, SEEK_SET) == 0);
  long got = 0;
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0) got += n;
  REQUIRE(got == page * pages);
}

}  // namespace

TEST_CASE("misses when evicted, hits when cached, dirtied on write", "[page_cache]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  const long page = sysconf(_SC_PAGESIZE);
  constexpr long kPages = 512;
  test::EvictedFile file(kPages, 'y');
  const int fd = file.fd();
  const std::vector<char> data(file.size(), 'y');

  MetricStore store;
  auto tracer = test::start_tracer(store, "page_cache", "    hook: " + hook + "\n");
  // Accesses come from fentry on folio_mark_accessed (or mark_page_accessed before folios)
  // where the kernel allows it, else from a kprobe on it, else from the read and fault
  // tracepoints.
  KernelHookProber prober;
  const bool fentry = prober.can_attach(HookKind::Fentry, "folio_mark_accessed") ||
                      prober.can_attach(HookKind::Fentry, "mark_page_accessed");
  INFO("fentry on folio_mark_accessed: "
       << (fentry ? "attaches" : prober.failure(HookKind::Fentry, "folio_mark_accessed")));
  const bool kprobes = access("/sys/bus/event_source/devices/kprobe/type", F_OK) == 0;
  const std::string access_hook = fentry ? "fentry+" : kprobes ? "kprobe+" : "";
  CHECK(tracer->hook() == access_hook + (hook == "auto" ? "tp_btf" : "raw_tp"));
  const Totals t0 = totals(*tracer, store);
  read_all(fd, page, kPages);  // cold: every page missing
  const Totals t1 = totals(*tracer, store);
  read_all(fd, page, kPages);  // warm: every page cached
  const Totals t2 = totals(*tracer, store);
  constexpr long kDirty = 64;
  REQUIRE(pwrite(fd, data.data(), static_cast<std::size_t>(page * kDirty), 0) == page * kDirty);
  const Totals t3 = totals(*tracer, store);

  INFO("cold read: accesses " << t1.accesses - t0.accesses << " misses " << t1.misses - t0.misses
                              << "; warm read: accesses " << t2.accesses - t1.accesses << " misses "
                              << t2.misses - t1.misses << "; write: dirtied "
                              << t3.dirtied - t2.dirtied);
  // Cold: all pages were added; the background of a quiet machine adds a few more.
  CHECK(t1.misses - t0.misses >= kPages);
  CHECK(t1.misses - t0.misses <= kPages + 64);
  CHECK(t1.accesses - t0.accesses >= kPages);
  // Warm: about kPages accesses (each read asks for exactly its 16 pages), almost no misses.
  CHECK(t2.accesses - t1.accesses >= kPages);
  CHECK(t2.accesses - t1.accesses <= kPages + kPages / 10);
  CHECK(t2.misses - t1.misses <= 16);
  // Rewriting cached pages dirties each once.
  CHECK(t3.dirtied - t2.dirtied >= kDirty);
  CHECK(t3.dirtied - t2.dirtied <= kDirty + 64);
}
