// page_faults on the real kernel: faults the test causes, against /proc/vmstat.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "../kernel_counters.h"
#include "../kernel_fixtures.h"
#include "../metrics_lookup.h"
#include "../workloads.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

double faults(const MetricStore& store, const char* type) {
  return test::counter_value(store, "ebpf_page_faults_total", {{"type", type}});
}

struct VmstatFaults {
  std::uint64_t all = test::proc_counter("/proc/vmstat", "pgfault");
  std::uint64_t major = test::proc_counter("/proc/vmstat", "pgmajfault");
};

}  // namespace

TEST_CASE("minor and major faults match what the test caused and /proc/vmstat", "[page_faults]") {
  const long page = sysconf(_SC_PAGESIZE);
  // Read through a mapping, an evicted file faults every page in (major).
  constexpr int kFilePages = 512;
  test::EvictedFile evicted(kFilePages, 'x');
  const int fd = evicted.fd();
  const std::size_t file_len = evicted.size();

  constexpr int kAnonPages = 20000;
  MetricStore store;
  auto tracer = test::start_tracer(store, "page_faults");
  CHECK(tracer->hook() == "perf_event");

  const VmstatFaults v0;
  tracer->drain();
  const double minor0 = faults(store, "minor"), major0 = faults(store, "major");

  // Minor: first touch of fresh anonymous pages, one fault each.
  workload::touch_anon_pages(kAnonPages);

  // Major: read the evicted file through a mapping, without readahead.
  auto* file = static_cast<volatile char*>(mmap(nullptr, file_len, PROT_READ, MAP_SHARED, fd, 0));
  REQUIRE(file != MAP_FAILED);
  madvise(const_cast<char*>(file), file_len, MADV_RANDOM);
  long sum = 0;
  for (std::size_t off = 0; off < file_len; off += static_cast<std::size_t>(page)) {
    sum += file[off];
  }
  CHECK(sum == 'x' * kFilePages);

  tracer->drain();
  const VmstatFaults v1;
  const double minor = faults(store, "minor") - minor0;
  const double major = faults(store, "major") - major0;
  const double vm_all = static_cast<double>(v1.all - v0.all);
  const double vm_major = static_cast<double>(v1.major - v0.major);
  INFO("minor " << minor << " major " << major << " | vmstat pgfault " << vm_all << " pgmajfault "
                << vm_major);
  CHECK(minor >= kAnonPages);
  CHECK(major >= kFilePages);
  // The perf events count completed faults. /proc/vmstat's pgfault counts attempts on kernels
  // that count it on entry to handle_mm_fault (6.1 does, 6.18 does not): a fault that drops
  // the mmap lock to wait for its page's I/O (VM_FAULT_RETRY) is counted there again when it
  // retries, and completes as a major fault. So the difference is the retries: never
  // negative, never more than the major faults, plus the few faults of the microseconds by
  // which the vmstat window encloses ours.
  const double retries = vm_all - (minor + major);
  INFO("pgfault - (minor + major) = " << retries);
  CHECK(retries >= 0);
  CHECK(retries <= major + 100);
  CHECK(major <= vm_major);
  CHECK(major >= vm_major * 0.995 - 10);

  munmap(const_cast<char*>(file), file_len);
}
