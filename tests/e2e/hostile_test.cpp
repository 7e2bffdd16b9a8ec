// Hostile clients against the running daemon: TLS connections reset at every stage and
// downloads aborted mid-way. After each class the daemon must live, and a good scrape made
// alongside must succeed within a second.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "daemon_process.h"

using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;

namespace {

// A daemon serving TLS with a self-signed certificate for 127.0.0.1.
struct TlsDaemon {
  Setup s;
  std::unique_ptr<DaemonProcess> d;
  std::string base;

  TlsDaemon() {
    const std::string cmd =
        "cd " + s.dir +
        " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2"
        " -keyout server.key -out server.pem -subj /CN=127.0.0.1"
        " -addext subjectAltName=IP:127.0.0.1 2>/dev/null";
    REQUIRE(run_command(cmd) == 0);
    std::ofstream(s.dir + "/web.yml") << "tls_server_config:\n  cert_file: " << s.dir
                                      << "/server.pem\n  key_file: " << s.dir << "/server.key\n";
    auto args = s.args();
    args.push_back("--web.config.file");
    args.push_back(s.dir + "/web.yml");
    d = std::make_unique<DaemonProcess>(DAEMON_PATH, s.log,
                                        DaemonProcess::Options{args, false, {}, {}});
    base = "https://127.0.0.1:" + std::to_string(s.port);
    REQUIRE(wait_until([&] { return scrape_status() == "200"; }, 20s));
  }
  // The status of one scrape that must finish within `limit`, "000" if none came.
  std::string scrape_status(const char* limit = "5") const {
    return run_capture("curl -sk -o /dev/null -w '%{http_code}' --max-time " + std::string(limit) +
                       " " + base + "/metrics");
  }
  // Runs the python3 hostile client `mode` `n` times against the daemon.
  int hostile(const std::string& mode, int n) const {
    return run_command("python3 " SOURCE_DIR "/tests/e2e/hostile_client.py " + mode +
                       " 127.0.0.1 " + std::to_string(s.port) + " " + std::to_string(n));
  }
};

}  // namespace

TEST_CASE("TLS clients that reset at every stage leave the daemon serving") {
  TlsDaemon t;
  for (const std::string mode : {"reset-in-handshake", "reset-after-handshake", "reset-mid-request",
                                 "reset-after-request", "close-after-request"}) {
    INFO("hostile client: " << mode << "\ndaemon log:\n" << t.d->log());
    auto hostile = std::async(std::launch::async, [&] { return t.hostile(mode, 50); });
    // A good scrape while they run.
    CHECK(t.scrape_status("1") == "200");
    CHECK(hostile.get() == 0);
    CHECK(t.d->wait_exit(0ms) == -1);  // still running
    CHECK(t.scrape_status("1") == "200");
  }
}

TEST_CASE("downloads aborted mid-way, plain and TLS, leave the daemon serving") {
  TlsDaemon t;
  for (int i = 0; i < 20; ++i) {
    // curl gives up once the body passes 100 bytes: the server is left writing to a closed
    // connection.
    run_command("curl -sk -o /dev/null --max-filesize 100 " + t.base + "/metrics");
  }
  INFO("daemon log:\n" << t.d->log());
  CHECK(t.d->wait_exit(0ms) == -1);
  CHECK(t.scrape_status("1") == "200");
}
