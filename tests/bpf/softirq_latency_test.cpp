// softirq_latency on the real kernel: NET_RX softirqs the test causes with loopback
// datagrams, counted against the kernel's own count in /proc/softirqs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "../kernel_counters.h"
#include "../metrics_lookup.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

using Counts = std::map<std::string, std::uint64_t>;

// One drain, with /proc/softirqs read just before and just after it: for a vector whose two
// reads agree no handler ran while the drain read the maps, so the drain's count of it is
// exactly the kernel's.
struct Edge {
  Counts before, after;
  bool quiet(const std::string& vector) const { return before.at(vector) == after.at(vector); }
};

Edge drain_between_reads(Tracer& tracer) {
  Edge e;
  e.before = test::softirq_counts();
  tracer.drain();
  e.after = test::softirq_counts();
  return e;
}

// Drains until `vector` is quiet across the drain (at most 50 tries).
Edge quiet_drain(Tracer& tracer, const std::string& vector) {
  Edge e = drain_between_reads(tracer);
  for (int i = 0; i < 50 && !e.quiet(vector); ++i) e = drain_between_reads(tracer);
  return e;
}

Counts entries(const MetricStore& store) {
  Counts c;
  for (const char* v : {"hi", "timer", "net_tx", "net_rx", "block", "irq_poll", "tasklet", "sched",
                        "hrtimer", "rcu"}) {
    c[v] = static_cast<std::uint64_t>(
        test::counter_value(store, "ebpf_softirqs_total", {{"vector", v}}));
  }
  return c;
}

// `n` UDP datagrams to a socket on 127.0.0.1, each received: every send queues the packet
// to the CPU's backlog and raises NET_RX, whose handler delivers it.
void loopback_datagrams(int n) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  char buf[64] = {};
  for (int i = 0; i < n; ++i) {
    REQUIRE(sendto(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) ==
            sizeof buf);
    REQUIRE(recv(fd, buf, sizeof buf, 0) == sizeof buf);
  }
  close(fd);
}

}  // namespace

TEST_CASE("softirq_latency counts every handler run as /proc/softirqs does", "[softirq]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  MetricStore store;
  auto tracer = test::start_tracer(store, "softirq_latency", "    hook: " + hook + "\n");
  CHECK(tracer->hook() == (hook == "auto" ? "tp_btf" : "raw_tp"));

  const test::Labels rx = {{"vector", "net_rx"}};
  const auto timed = [&](const char* metric) { return test::histogram_count(store, metric, rx); };
  const Edge start = quiet_drain(*tracer, "net_rx");
  const Counts ours0 = entries(store);
  const std::uint64_t latency0 = timed("ebpf_softirq_latency_seconds");
  const std::uint64_t runtime0 = timed("ebpf_softirq_runtime_seconds");
  constexpr int kDatagrams = 200;
  loopback_datagrams(kDatagrams);
  const Edge end = quiet_drain(*tracer, "net_rx");
  const Counts ours1 = entries(store);

  // NET_RX, which the test drove, must have been quiet at both edges, and is counted
  // exactly as the kernel counts it. Another vector quiet at both edges is too, but for a
  // run caught between the kernel's count and the tracepoint on another CPU at an edge (a
  // virtual CPU can stall there): at most one a CPU each edge. A busy vector is counted
  // within the reads around the drains.
  REQUIRE(start.quiet("net_rx"));
  REQUIRE(end.quiet("net_rx"));
  const auto cpus = static_cast<std::uint64_t>(libbpf_num_possible_cpus());
  for (const auto& [vector, n0] : ours0) {
    const std::uint64_t ours = ours1.at(vector) - n0;
    INFO(vector << ": ours " << ours << ", /proc/softirqs " << start.before.at(vector) << " -> "
                << end.after.at(vector));
    if (vector == "net_rx") {
      CHECK(ours == end.before.at(vector) - start.before.at(vector));
    } else if (start.quiet(vector) && end.quiet(vector)) {
      const std::uint64_t kernel = end.before.at(vector) - start.before.at(vector);
      CHECK(ours + 2 * cpus >= kernel);
      CHECK(ours <= kernel + 2 * cpus);
    } else {
      CHECK(ours >= end.before.at(vector) - start.after.at(vector));
      CHECK(ours <= end.after.at(vector) - start.before.at(vector));
    }
  }
  // The datagrams' handler runs: at least one (a run may deliver many), each timed from the
  // first raise since the run before (all seen: the tracer was attached before), and their
  // run times measured (a run still going on another CPU at an edge ends on the other side
  // of it: one per CPU at most).
  const std::uint64_t net_rx = ours1.at("net_rx") - ours0.at("net_rx");
  CHECK(net_rx >= 1);
  CHECK(timed("ebpf_softirq_latency_seconds") - latency0 == net_rx);
  const std::uint64_t runtime = timed("ebpf_softirq_runtime_seconds") - runtime0;
  CHECK(runtime + cpus >= net_rx);
  CHECK(runtime <= net_rx + cpus);
  CHECK(test::histogram_sum(store, "ebpf_softirq_runtime_seconds", rx) > 0);
}
