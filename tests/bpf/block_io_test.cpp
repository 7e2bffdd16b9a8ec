// block_io on the real kernel: direct I/O the test does on a loop device, against the
// device's /sys/block/<dev>/stat and libbpf-tools biolatency.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "../metrics_lookup.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[256];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  if (p) pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A loop device over a temporary 16 MiB file on a real disk.
class LoopDevice {
 public:
  LoopDevice() {
    char path[] = "/var/tmp/emd-loop-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 16 << 20) == 0);
    close(fd);
    file_ = path;
    dev_ = shell("losetup --find --show " + file_);
    REQUIRE(dev_.rfind("/dev/loop", 0) == 0);
    name_ = dev_.substr(5);
  }
  ~LoopDevice() {
    shell("losetup -d " + dev_);
    unlink(file_.c_str());
  }
  const std::string& dev() const { return dev_; }
  const std::string& name() const { return name_; }

  // /sys/block/<dev>/stat: completed reads, sectors read, completed writes, sectors written.
  std::array<std::uint64_t, 4> stat() const {
    std::ifstream in("/sys/block/" + name_ + "/stat");
    std::uint64_t f[8] = {};
    for (auto& v : f) in >> v;
    return {f[0], f[2], f[4], f[6]};
  }

 private:
  std::string file_, dev_, name_;
};

std::uint64_t histogram_total(const std::string& text) {
  std::uint64_t total = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long lo, hi, count;
    if (std::sscanf(line.c_str(), " %llu -> %llu : %llu", &lo, &hi, &count) == 3) total += count;
  }
  return total;
}

}  // namespace

TEST_CASE("direct 4 KiB reads and writes on a loop device are counted exactly", "[block_io]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  LoopDevice loop;
  MetricStore store;
  auto tracer = test::start_tracer(store, "block_io", "    hook: " + hook + "\n");
  CHECK(tracer->hook() == (hook == "auto" ? "tp_btf" : "raw_tp"));

  const int fd = open(loop.dev().c_str(), O_RDWR | O_DIRECT);
  REQUIRE(fd >= 0);
  void* buf = nullptr;
  REQUIRE(posix_memalign(&buf, 4096, 4096) == 0);
  std::memset(buf, 0xab, 4096);

  // biolatency over the same I/O, for a second opinion.
  FILE* oracle = popen(("stdbuf -oL /usr/sbin/biolatency -d " + loop.name() + " 3 1 2>&1").c_str(), "r");
  REQUIRE(oracle != nullptr);
  std::string out;
  char line[512];
  while (fgets(line, sizeof line, oracle)) {
    out += line;
    if (out.find("Tracing block device I/O") != std::string::npos) break;
  }
  REQUIRE_THAT(out, Catch::Matchers::Contains("Tracing block device I/O"));

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
  while (fgets(line, sizeof line, oracle)) out += line;
  pclose(oracle);
  close(fd);
  free(buf);

  const std::uint64_t reads = test::histogram_count(store, "ebpf_block_io_latency_seconds", rd) - r0;
  const std::uint64_t writes = test::histogram_count(store, "ebpf_block_io_latency_seconds", wr) - w0;
  const double rbytes = test::counter_value(store, "ebpf_block_io_bytes_total", rd) - rb0;
  const double wbytes = test::counter_value(store, "ebpf_block_io_bytes_total", wr) - wb0;
  INFO("reads " << reads << " writes " << writes << " | sysfs reads " << s1[0] - s0[0]
                << " writes " << s1[2] - s0[2] << " | biolatency total " << histogram_total(out)
                << "\n" << out);
  CHECK(reads == kOps);
  CHECK(writes == kOps);
  CHECK(rbytes == kOps * 4096.0);
  CHECK(wbytes == kOps * 4096.0);
  CHECK(s1[0] - s0[0] == reads);
  CHECK(s1[2] - s0[2] == writes);
  CHECK((s1[1] - s0[1]) * 512 == static_cast<std::uint64_t>(rbytes));
  CHECK((s1[3] - s0[3]) * 512 == static_cast<std::uint64_t>(wbytes));
  // biolatency's window (its 3 s interval) encloses ours; nothing else uses this device.
  CHECK(histogram_total(out) == reads + writes);
}
