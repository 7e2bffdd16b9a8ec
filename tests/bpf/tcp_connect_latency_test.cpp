// tcp_connect_latency on the real kernel: loopback connects the test makes, against
// /proc/net/snmp Tcp ActiveOpens.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "../kernel_counters.h"
#include "../metrics_lookup.h"
#include "../slow_reads.h"
#include "ebpf_metricsd/profile/profiles.h"
#include "tracer_fixture.h"

using namespace ebpf_metricsd;

namespace {

struct Loopback {
  int family;
  sockaddr_storage addr{};
  socklen_t len = 0;

  explicit Loopback(int f) : family(f) {
    if (f == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(sockaddr_in);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof(sockaddr_in6);
    }
  }
  void set_port(int port) {
    if (family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(port);
    else
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  }
  int port_of(int fd) {
    sockaddr_storage a{};
    socklen_t l = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    return ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&a)->sin_port
                                   : reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  }
  // A listening socket on a free port.
  int listen_any() {
    set_port(0);
    const int fd = socket(family, SOCK_STREAM, 0);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(listen(fd, 1024) == 0);
    set_port(port_of(fd));
    return fd;
  }
  // A port nothing listens on: bound, then closed.
  void closed_port() {
    set_port(0);
    const int fd = socket(family, SOCK_STREAM, 0);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    set_port(port_of(fd));
    close(fd);
  }
  bool connect_once() {
    const int fd = socket(family, SOCK_STREAM, 0);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    close(fd);
    return ok;
  }
};

}  // namespace

TEST_CASE("every loopback connect and refusal is counted, per family", "[tcp]") {
  const std::string hook = GENERATE(std::string("auto"), std::string("raw_tp"));
  INFO("hook " << hook);
  MetricStore store;
  auto tracer = test::start_tracer(store, "tcp_connect_latency", "    hook: " + hook + "\n");

  constexpr int kConnects = 50, kRefused = 20;
  Loopback v4(AF_INET), v6(AF_INET6);
  const int l4 = v4.listen_any(), l6 = v6.listen_any();
  Loopback c4(AF_INET), c6(AF_INET6);
  c4.closed_port();
  c6.closed_port();

  const std::uint64_t opens0 = test::snmp_counter("Tcp", "ActiveOpens");
  tracer->drain();
  const auto count = [&](const char* fam) {
    return test::histogram_count(store, "ebpf_tcp_connect_latency_seconds", {{"family", fam}});
  };
  const auto failed = [&](const char* fam) {
    return test::counter_value(store, "ebpf_tcp_connect_failures_total", {{"family", fam}});
  };
  const std::uint64_t ok4 = count("ipv4"), ok6 = count("ipv6");
  const double bad4 = failed("ipv4"), bad6 = failed("ipv6");
  const double sum4 =
      test::histogram_sum(store, "ebpf_tcp_connect_latency_seconds", {{"family", "ipv4"}});
  double v4_s = 0;  // the wall time of the IPv4 connects, one after another
  for (int i = 0; i < kConnects; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(v4.connect_once());
    v4_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(v6.connect_once());
  }
  for (int i = 0; i < kRefused; ++i) {
    REQUIRE_FALSE(c4.connect_once());
    REQUIRE_FALSE(c6.connect_once());
  }
  tracer->drain();
  const std::uint64_t opens = test::snmp_counter("Tcp", "ActiveOpens") - opens0;
  close(l4);
  close(l6);

  const std::uint64_t d_ok4 = count("ipv4") - ok4, d_ok6 = count("ipv6") - ok6;
  const double d_bad4 = failed("ipv4") - bad4, d_bad6 = failed("ipv6") - bad6;
  INFO("ipv4 " << d_ok4 << " ok " << d_bad4 << " failed; ipv6 " << d_ok6 << " ok " << d_bad6
               << " failed; ActiveOpens " << opens);
  CHECK(d_ok4 == kConnects);
  CHECK(d_ok6 == kConnects);
  CHECK(d_bad4 == kRefused);
  CHECK(d_bad6 == kRefused);
  CHECK(static_cast<double>(d_ok4 + d_ok6) + d_bad4 + d_bad6 == static_cast<double>(opens));

  // More than 0, and within the time the connects took: each connect() returned once its
  // handshake ended, so each IPv4 handshake lies within its own call's wall time, at any
  // machine speed.
  const double d_sum4 =
      test::histogram_sum(store, "ebpf_tcp_connect_latency_seconds", {{"family", "ipv4"}}) - sum4;
  INFO("IPv4 handshakes " << d_sum4 << " s; their calls took " << v4_s << " s");
  CHECK(d_sum4 > 0);
  CHECK(d_sum4 <= v4_s);
}

TEST_CASE("slow connects: every loopback connect is an event with the connecting task's stack",
          "[tcp][slow]") {
  MetricStore store;
  profiling::Profiles profiles;
  // 1us: a connect (SYN, SYN-ACK, ACK through the loopback) takes more at any machine speed.
  auto tracer = test::start_tracer(store, "tcp_connect_latency",
                                   "    slow: {threshold: 1us, max_per_second: 1000}\n", &profiles);
  constexpr int kConnects = 10;
  Loopback lo(AF_INET);
  const int listener = lo.listen_any();
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (int i = 0; i < kConnects; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0 || test::connect_in_known_function(fd, &lo.addr, lo.len) != 0) _exit(1);
      close(fd);
    }
    char c;
    _exit(read(go[0], &c, 1) == 1 ? 0 : 1);  // stays until its events are in
  }
  profiling::SlowEventStore::Query q;
  q.metric = "ebpf_tcp_connect_latency_seconds";
  const auto ours = test::wait_for_slow_events(
      tracer, profiles, q.metric, kConnects,
      [&](const auto& e) { return e.pid == static_cast<std::uint32_t>(child); });
  REQUIRE(write(go[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  close(go[0]);
  close(go[1]);
  close(listener);

  CHECK(ours.size() == kConnects);  // one per connect the child made
  const auto window = profiles.slow_events().query(q);
  for (const auto& e : ours) {
    CHECK(e.series == std::vector<std::pair<std::string, std::string>>{{"family", "ipv4"}});
    REQUIRE(window.stacks.count(e.stack_id) == 1);
    bool named = false;
    for (const auto& f : window.stacks.at(e.stack_id)) {
      named = named || f.function.find("connect_in_known_function") != std::string::npos;
    }
    CHECK(named);
  }
  // The bucket of the child's last connect carries the newest event kept in it as its
  // exemplar: that connect, or a later one of another process on the host.
  test::check_bucket_exemplar(store, window, ours.back(),
                              "ebpf_tcp_connect_latency_seconds_bucket{family=\"ipv4\",");
  const auto fams = test::collect(store);
  test::check_no_drops(fams, "tcp_connect_latency",
                       {"slow_limited", "slow_ring_full", "slow_queue_full", "slow_origin_full"});
}

TEST_CASE(
    "slow connects through the C library: held until connect() returns, the stack names its "
    "caller up to main, with and without frame pointers",
    "[tcp][slow][unwind]") {
  // io_workload: main -> connect_all -> connect_once -> connect(), a blocking connect through
  // the C library (whose wrapper keeps no frame), built as Debian builds and with frame
  // pointers. The connecting thread is inside connect() until the handshake is done, so each
  // event is sent when the call returns, with a copy of the user stack it returns to.
  const std::string binary =
      GENERATE(from_range(test::workload_builds(IO_WORKLOAD_FP, IO_WORKLOAD_NOFP)));
  INFO(binary);
  constexpr int kConnects = 10;
  MetricStore store;
  profiling::Profiles profiles;
  // 1us: a connect through the loopback takes more at any machine speed.
  auto tracer = test::start_tracer(store, "tcp_connect_latency",
                                   "    slow: {threshold: 1us, max_per_second: 1000}\n", &profiles);
  Loopback lo(AF_INET);
  const int listener = lo.listen_any();
  const int port = ntohs(reinterpret_cast<sockaddr_in*>(&lo.addr)->sin_port);
  test::SpawnedWorkload w({binary, "connect", std::to_string(port), std::to_string(kConnects)},
                          /*gated=*/true);
  const auto pid = static_cast<std::uint32_t>(w.pid());
  const std::string metric = "ebpf_tcp_connect_latency_seconds";
  const auto found = test::wait_for_slow(
      tracer, profiles, metric, kConnects,
      [&](const profiling::SlowEvent& e, const profiling::SlowWindow&) { return e.pid == pid; });
  CHECK(w.finish() == 0);
  close(listener);

  REQUIRE(found.events.size() == kConnects);  // one per connect, none lost
  for (const auto& e : found.events) {
    const auto user = test::user_functions(e, found.window);
    INFO("user frames: " << test::chain_text(user));
    CHECK_FALSE(e.stack_at_start);
    CHECK(test::holds_in_order(user, {"connect_once", "connect_all", "main"}));
  }
  const auto fams = test::collect(store);
  const auto* complete =
      test::find_series(fams, "ebpf_metricsd_slow_unwinds_total",
                        {{"tracer", "tcp_connect_latency"}, {"result", "complete"}});
  REQUIRE(complete);
  CHECK(complete->counter.value >= kConnects);
  test::check_no_drops(fams, "tcp_connect_latency",
                       {"slow_limited", "slow_ring_full", "slow_queue_full", "slow_origin_full",
                        "slow_return_mismatch", "slow_return_exited", "slow_return_full",
                        "slow_return_late", "slow_return_second"});
}
