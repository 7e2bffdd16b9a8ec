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

#include "../cgroup_fixture.h"
#include "../metrics_lookup.h"
#include "../test_support.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;


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
  CHECK(test::counter_value(store, "ebpf_oom_kills_total",
                            {{"cgroup", "/"}, {"pod", ""}, {"container", ""}}) == 0);
}
