// The drain loop pings the systemd watchdog only after rounds in which every drain of the
// tracer set worked; the set drains a tracer it stops one last time.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <thread>

#include "../metrics_lookup.h"
#include "../test_support.h"
#include "ebpf_metricsd/core/drain_loop.h"
#include "ebpf_metricsd/core/tracer_set.h"

using namespace ebpf_metricsd;
using namespace std::chrono_literals;

namespace {

class FlakyTracer : public Tracer {
 public:
  std::atomic<bool> fail{true};
  std::atomic<int> drains{0};
  void start(HookProber&, HookPreference) override {}
  std::string hook() const override { return "none"; }
  void drain() override {
    ++drains;
    if (fail) throw std::runtime_error("map read failed");
  }
};

// The set owns what its builder returns: this one passes drains on to a tracer the test
// keeps.
class ForwardingTracer : public Tracer {
 public:
  explicit ForwardingTracer(FlakyTracer& t) : t_(t) {}
  void start(HookProber& p, HookPreference h) override { t_.start(p, h); }
  std::string hook() const override { return t_.hook(); }
  void drain() override { t_.drain(); }

 private:
  FlakyTracer& t_;
};

TracerConfig flaky_config() {
  TracerConfig tc;
  tc.name = "flaky";
  tc.enabled = true;
  return tc;
}

// Datagrams sent to NOTIFY_SOCKET, which this sets for the process.
class NotifyCapture {
 public:
  NotifyCapture() : dir_(test::temp_dir()) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string path = dir_ + "/notify";
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    setenv("NOTIFY_SOCKET", path.c_str(), 1);
  }
  ~NotifyCapture() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    test::run_command("rm -rf " + dir_);
  }
  int count(const std::string& message) {
    char buf[512];
    ssize_t n;
    while ((n = recv(fd_, buf, sizeof buf, 0)) > 0) {
      if (std::string(buf, static_cast<std::size_t>(n)) == message) ++seen_;
    }
    return seen_;
  }

 private:
  std::string dir_;
  int fd_;
  int seen_ = 0;
};

}  // namespace

TEST_CASE("WATCHDOG=1 only after rounds in which every drain succeeded") {
  NotifyCapture notify;
  MetricStore store;
  FlakyTracer tracer;
  TracerSet set(store, [&](const TracerConfig&, MetricScope&) {
    return std::unique_ptr<Tracer>(new ForwardingTracer(tracer));
  });
  REQUIRE(set.apply({flaky_config()}).empty());
  DrainLoop loop([&] { return set.drain(); }, 50ms);
  loop.start();
  REQUIRE(test::wait_until([&] { return tracer.drains >= 5; }, 30s));
  CHECK(notify.count("WATCHDOG=1") == 0);
  CHECK(test::counter_value(store, "ebpf_metricsd_drain_errors_total", {{"tracer", "flaky"}}) >= 5);
  tracer.fail = false;
  CHECK(test::wait_until([&] { return notify.count("WATCHDOG=1") >= 3; }, 30s));
  CHECK(loop.healthy());
  loop.stop();
  const int drains = tracer.drains;
  std::this_thread::sleep_for(150ms);
  CHECK(tracer.drains == drains);  // stopped means stopped
}

TEST_CASE("a tracer disabled by apply is drained one last time, then no more") {
  MetricStore store;
  FlakyTracer tracer;
  tracer.fail = false;
  TracerSet set(store, [&](const TracerConfig&, MetricScope&) {
    return std::unique_ptr<Tracer>(new ForwardingTracer(tracer));
  });
  REQUIRE(set.apply({flaky_config()}).empty());
  TracerConfig off = flaky_config();
  off.enabled = false;
  set.apply({off});
  CHECK(tracer.drains == 1);
  CHECK(set.drain());  // nothing left to drain
  CHECK(tracer.drains == 1);
  CHECK(set.running() == 0);
}
