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

#include "../cgroup_fixture.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {
// The label set of this test process's own cgroup ("0::<path>" in /proc/self/cgroup).
test::Labels own_cgroup_labels() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, path = "/";
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  const CgroupLabel l = cgroup_label_for_path(path == "/" ? "" : path);
  return {{"cgroup", l.cgroup}, {"pod", l.pod}, {"container", l.container}};
}
}  // namespace

TEST_CASE("a process the OOM killer kills in a memory-limited cgroup counts once there",
          "[oom_kills]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  test::TestCgroup cg("oom");
  test::MemoryLimit limit(cg);
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
    test::exceed_memory_limit();
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
  CHECK(test::counter_value(store, "ebpf_oom_kills_total", own_cgroup_labels()) == 0);
}

TEST_CASE("a kill in a cgroup removed before the drain counts under its parent", "[oom_kills]") {
  // As a container runtime removes an OOM-killed container's cgroup at once: the kill then
  // counts under the pod, its parent.
  test::TestCgroup parent("oomp");
  test::MemoryLimit limit(parent);
  test::TestCgroup victim(parent, "container");
  MetricStore store;
  auto tracer = test::start_tracer(store, "oom_kills");
  const test::Labels labels = {{"cgroup", parent.label()}, {"pod", ""}, {"container", ""}};
  const std::uint64_t k0 = limit.kills();
  tracer->drain();
  const int status = victim.run_status([&] {
    limit.enter();
    test::exceed_memory_limit();
  });
  REQUIRE(WIFSIGNALED(status));
  victim.remove();
  tracer->drain();
  INFO("oom_kill " << limit.kills() - k0);
  CHECK(limit.kills() - k0 == 1);
  CHECK(test::counter_value(store, "ebpf_oom_kills_total", labels) == 1);
  CHECK(test::counter_value(store, "ebpf_oom_kills_total",
                            {{"cgroup", "unknown"}, {"pod", ""}, {"container", ""}}) == 0);
}
