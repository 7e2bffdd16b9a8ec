// oom_kills on the real kernel: a process in a memory-limited cgroup the test makes
// allocates until the kernel's OOM killer kills it; the counter of its cgroup moves by one,
// as the memory controller's own oom_kill count does.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <optional>
#include <sstream>

#include "../cgroup_fixture.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

constexpr long kLimit = 64L << 20;

bool write_file(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  return static_cast<bool>(out);
}

std::uint64_t field(const std::string& file, const std::string& name) {
  std::istringstream in(test::read_file(file));
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    if (key == name) return value;
  }
  throw std::runtime_error("no " + name + " in " + file);
}

// The memory limit: the v2 memory controller where the v2 hierarchy has it, else the v1
// memory controller (hybrid hosts, where v1 holds every controller).
class MemoryLimit {
 public:
  explicit MemoryLimit(const test::TestCgroup& cg) {
    const std::string v2_root = cgroup2_mount();
    if (test::read_file(v2_root + "/cgroup.controllers").find("memory") != std::string::npos) {
      write_file(v2_root + "/cgroup.subtree_control", "+memory");
      events_ = cg.path() + "/memory.events.local";
      REQUIRE(write_file(cg.path() + "/memory.max", std::to_string(kLimit)));
      write_file(cg.path() + "/memory.swap.max", "0");  // absent without swap accounting
      key_ = "oom_kill";
    } else {
      v1_ = "/sys/fs/cgroup/memory/emd-oom-" + std::to_string(getpid());
      rmdir(v1_.c_str());
      REQUIRE(mkdir(v1_.c_str(), 0755) == 0);
      REQUIRE(write_file(v1_ + "/memory.limit_in_bytes", std::to_string(kLimit)));
      write_file(v1_ + "/memory.memsw.limit_in_bytes", std::to_string(kLimit));
      events_ = v1_ + "/memory.oom_control";
      key_ = "oom_kill";
    }
  }
  ~MemoryLimit() {
    if (!v1_.empty()) rmdir(v1_.c_str());
  }
  // In the child: join the v1 cgroup (nothing to do under v2: it was born in the limit).
  void enter() const {
    if (!v1_.empty() && !write_file(v1_ + "/cgroup.procs", "0"))
      throw std::runtime_error("join " + v1_);
  }
  std::uint64_t kills() const { return field(events_, key_); }
  std::string where() const { return v1_.empty() ? "cgroup v2 memory.max" : "cgroup v1 " + v1_; }

 private:
  std::string v1_, events_, key_;
};

}  // namespace

TEST_CASE("a process the OOM killer kills in a memory-limited cgroup counts once there",
          "[oom_kills]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  test::TestCgroup cg("oom");
  MemoryLimit limit(cg);
  INFO("limit by " << limit.where());
  MetricStore store;
  auto tracer = test::start_tracer(store, "oom_kills", "    hook: " + hook + "\n");
  CHECK(tracer->hook() == (hook == "auto" ? "tp_btf" : "raw_tp"));
  const test::Labels labels = {{"cgroup", cg.label()}, {"pod", ""}, {"container", ""}};

  const std::uint64_t k0 = limit.kills();
  tracer->drain();
  const double c0 = test::counter_value(store, "ebpf_oom_kills_total", labels);
  const int status = cg.run_status([&] {
    limit.enter();
    // Anonymous memory, touched page by page, far past the limit (no swap for it).
    const std::size_t len = static_cast<std::size_t>(kLimit) * 8;
    auto* p = static_cast<char*>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    madvise(p, len, MADV_NOHUGEPAGE);
    for (std::size_t off = 0; off < len; off += 4096) p[off] = 1;
  });
  tracer->drain();
  const std::uint64_t k1 = limit.kills();
  const double c1 = test::counter_value(store, "ebpf_oom_kills_total", labels);
  INFO("wait status " << status << "; oom_kill " << k1 - k0 << "; counted " << c1 - c0);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(k1 - k0 == 1);
  CHECK(c1 - c0 == 1);
  // The test process, outside the limit, was not the victim of anything.
  CHECK(test::counter_value(store, "ebpf_oom_kills_total",
                            {{"cgroup", "/"}, {"pod", ""}, {"container", ""}}) == 0);
}
