// block_io on the real kernel: direct I/O the test does on a loop device, against the
// device's /sys/block/<dev>/stat and libbpf-tools biolatency.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "../kernel_fixtures.h"
#include "../metrics_lookup.h"
#include "oracle_tool.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

TEST_CASE("direct 4 KiB reads and writes on a loop device are counted exactly", "[block_io]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  test::LoopDevice loop;
  MetricStore store;
  auto tracer = test::start_tracer(store, "block_io", "    hook: " + hook + "\n");
  CHECK(tracer->hook() == (hook == "auto" ? "tp_btf" : "raw_tp"));

  const int fd = open(loop.dev().c_str(), O_RDWR | O_DIRECT);
  REQUIRE(fd >= 0);
  void* buf = nullptr;
  REQUIRE(posix_memalign(&buf, 4096, 4096) == 0);
  std::memset(buf, 0xab, 4096);

  // biolatency over the same I/O, for a second opinion where it runs (Debian 12's build
  // does not load on 5.10, whose verifier refuses its global functions). The disk's own
  // counters in sysfs are the oracle on every kernel.
  std::optional<test::OracleTool> oracle;
  oracle.emplace("/usr/sbin/biolatency -d " + loop.name() + " 3 1", "Tracing block device I/O",
                 /*required=*/false);
  if (!oracle->started()) {
    WARN("biolatency does not run on this kernel; sysfs counters only:\n" << oracle->output());
    oracle.reset();
  }

  const auto s0 = loop.stat();
  tracer->drain();
  const test::Labels rd = {{"device", loop.name()}, {"op", "read"}};
  const test::Labels wr = {{"device", loop.name()}, {"op", "write"}};
  const std::uint64_t r0 = test::histogram_count(store, "ebpf_block_io_latency_seconds", rd);
  const std::uint64_t w0 = test::histogram_count(store, "ebpf_block_io_latency_seconds", wr);
  const double rb0 = test::counter_value(store, "ebpf_block_io_bytes_total", rd);
  const double wb0 = test::counter_value(store, "ebpf_block_io_bytes_total", wr);
  constexpr int kOps = 200;
  for (int i = 0; i < kOps; ++i) {
    // Every other 4 KiB block, so that no two requests are adjacent and could merge.
    const off_t off = static_cast<off_t>(i) * 8192;
    REQUIRE(pwrite(fd, buf, 4096, off) == 4096);
    REQUIRE(pread(fd, buf, 4096, off + 4096 * 1024) == 4096);
  }
  tracer->drain();
  const auto s1 = loop.stat();
  const std::string out = oracle ? oracle->finish() : std::string();
  close(fd);
  free(buf);

  const std::uint64_t reads =
      test::histogram_count(store, "ebpf_block_io_latency_seconds", rd) - r0;
  const std::uint64_t writes =
      test::histogram_count(store, "ebpf_block_io_latency_seconds", wr) - w0;
  const double rbytes = test::counter_value(store, "ebpf_block_io_bytes_total", rd) - rb0;
  const double wbytes = test::counter_value(store, "ebpf_block_io_bytes_total", wr) - wb0;
  INFO("reads " << reads << " writes " << writes << " | sysfs reads " << s1[0] - s0[0] << " writes "
                << s1[2] - s0[2] << " | biolatency total "
                << (oracle ? oracle->histogram_total() : 0) << "\n"
                << out);
  CHECK(reads == kOps);
  CHECK(writes == kOps);
  CHECK(rbytes == kOps * 4096.0);
  CHECK(wbytes == kOps * 4096.0);
  CHECK(s1[0] - s0[0] == reads);
  CHECK(s1[2] - s0[2] == writes);
  CHECK((s1[1] - s0[1]) * 512 == static_cast<std::uint64_t>(rbytes));
  CHECK((s1[3] - s0[3]) * 512 == static_cast<std::uint64_t>(wbytes));
  // biolatency's window (its 3 s interval) encloses ours; nothing else uses this device.
  if (oracle) CHECK(oracle->histogram_total() == reads + writes);
}
