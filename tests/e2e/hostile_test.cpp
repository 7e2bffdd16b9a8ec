// Hostile clients against the running daemon: TLS connections reset at every stage, downloads
// aborted mid-way, floods of slow, idle and half-open connections, password guessing,
// malformed credentials and many parallel scrapers. While each runs, a good scrape made
// alongside must succeed within a second; afterwards the daemon must live and serve.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon_process.h"
#include "ebpf_metricsd/http/basic_auth.h"

using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// The flood tests' web.request_timeout: short, so that the server's deadline falls within a
// test of a few seconds.
const char* const kRequestTimeoutKey = "  request_timeout: 3s\n";
constexpr double kRequestTimeout = 3.0;
// How much after request_timeout a connection may still be open: the server's timer and the
// flood client's loop on a loaded 2-core machine.
constexpr double kDeadlineSlack = 2.0;

const char* const kUser = "prometheus";
const char* const kPassword = "scrape-Pa55word";

struct DaemonOptions {
  bool tls = true;
  std::string web_keys;     // lines added under `web:` in the config
  bool basic_auth = false;  // kUser with kPassword, bcrypt cost 10
};

struct Scrape {
  std::string status;  // "000" when no answer came in time
  double seconds = 0;
};

// A daemon on 127.0.0.1, serving TLS with a self-signed certificate unless told otherwise.
struct WebDaemon {
  Setup s;
  std::unique_ptr<DaemonProcess> d;
  std::string base;
  std::string curl_auth;

  explicit WebDaemon(const DaemonOptions& o = DaemonOptions()) {
    if (!o.web_keys.empty()) {
      std::string config = read_file(s.config);
      config.insert(config.find("web:\n") + 5, o.web_keys);
      std::ofstream(s.config) << config;
    }
    std::ostringstream web;
    if (o.tls) {
      const std::string cmd =
          "cd " + s.dir +
          " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2"
          " -keyout server.key -out server.pem -subj /CN=127.0.0.1"
          " -addext subjectAltName=IP:127.0.0.1 2>/dev/null";
      REQUIRE(run_command(cmd) == 0);
      web << "tls_server_config:\n  cert_file: " << s.dir << "/server.pem\n  key_file: " << s.dir
          << "/server.key\n";
    }
    if (o.basic_auth) {
      const std::string hash = ebpf_metricsd::bcrypt_hash(kPassword, 10);
      REQUIRE_FALSE(hash.empty());
      web << "basic_auth_users:\n  " << kUser << ": " << hash << "\n";
      curl_auth = std::string(" -u ") + kUser + ":" + kPassword;
    }
    auto args = s.args();
    if (o.tls || o.basic_auth) {
      std::ofstream(s.dir + "/web.yml") << web.str();
      args.push_back("--web.config.file");
      args.push_back(s.dir + "/web.yml");
    }
    d = std::make_unique<DaemonProcess>(daemon_path(), s.log,
                                        DaemonProcess::Options{args, false, {}, {}});
    base = std::string(o.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(s.port);
    // With basic auth this first scrape is also the one whose password is then remembered.
    int exit_status = -1;
    const bool up = wait_until(
        [&] {
          exit_status = d->wait_exit(0ms);
          return exit_status != -1 || scrape_status() == "200";
        },
        20s);
    INFO("daemon log:\n" << d->log());
    REQUIRE(exit_status == -1);
    REQUIRE(up);
    // How long a scrape takes on this machine with nothing else at the daemon: the baseline
    // that the good scrapes during a flood are judged against.
    for (int i = 0; i < 5; ++i)
      quiet_scrape_seconds = std::max(quiet_scrape_seconds, scrape().seconds);
  }
  double quiet_scrape_seconds = 0;
  // How long a good scrape may take while hostile clients are at the daemon: twenty times the
  // slowest quiet scrape of this run, at least a second, and always under the floods'
  // request_timeout. A scrape that was only served once the flood's connections were cut would
  // take that long: the budget tells "served beside the flood" from "served after it" on a
  // machine of any speed.
  double good_scrape_budget() const {
    return std::min(0.8 * kRequestTimeout, std::max(1.0, 20 * quiet_scrape_seconds));
  }
  // The status of one scrape held to that budget ("000" when it took longer).
  std::string good_scrape_status() const {
    return scrape(std::to_string(good_scrape_budget()).c_str()).status;
  }
  // One scrape (with the credentials when basic auth is on) that must finish within `limit`.
  Scrape scrape(const char* limit = "5") const {
    const std::string out =
        run_capture("curl -sk -o /dev/null -w '%{http_code} %{time_total}' --max-time " +
                    std::string(limit) + curl_auth + " " + base + "/metrics");
    Scrape r;
    std::istringstream in(out);
    in >> r.status >> r.seconds;
    if (r.status.empty()) r.status = "000";
    return r;
  }
  std::string scrape_status(const char* limit = "5") const { return scrape(limit).status; }
  // Runs the python3 hostile client `mode` `n` times against the daemon.
  int hostile(const std::string& mode, int n) const {
    return run_command("python3 " SOURCE_DIR "/tests/e2e/hostile_client.py " + mode +
                       " 127.0.0.1 " + std::to_string(s.port) + " " + std::to_string(n));
  }
};

// `n` good scrapes one after another, `gap` apart: each must answer 200 within the budget.
// The slowest is printed, with the running test's name, for the record.
void check_good_scrapes(const WebDaemon& t, int n, std::chrono::milliseconds gap) {
  const double budget = t.good_scrape_budget();
  const std::string limit = std::to_string(budget);
  double slowest = 0;
  for (int i = 1; i <= n; ++i) {
    const Scrape r = t.scrape(limit.c_str());
    slowest = std::max(slowest, r.seconds);
    INFO("good scrape " << i << " of " << n << ": status " << r.status << " after " << r.seconds
                        << " s; budget " << budget << " s (quiet scrapes of this run took up to "
                        << t.quiet_scrape_seconds << " s)");
    CHECK(r.status == "200");
    CHECK(r.seconds < budget);
    std::this_thread::sleep_for(gap);
  }
  std::printf("good scrapes during \"%s\": %d, slowest %.1f ms (budget %.0f ms, quiet %.1f ms)\n",
              Catch::getResultCapture().getCurrentTestName().c_str(), n, slowest * 1000,
              budget * 1000, t.quiet_scrape_seconds * 1000);
}

// The end of the daemon's log: a flood can leave a line per connection in it.
std::string log_tail(const DaemonProcess& d, int lines = 40) {
  const std::string log = d.log();
  auto at = log.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i)
    at = log.rfind('\n', at - 1);
  return at == std::string::npos ? log : log.substr(at + 1);
}

void check_alive_and_serving(WebDaemon& t) {
  INFO("daemon log, end:\n" << log_tail(*t.d));
  CHECK(t.d->wait_exit(0ms) == -1);
  CHECK(t.good_scrape_status() == "200");
}

// tests/e2e/flood_client.py in the background (its docstring has the modes and options).
class Flood {
 public:
  Flood(const WebDaemon& t, const std::string& mode, const std::string& options, int hold_seconds)
      : ready_file_(t.s.dir + "/flood-ready-" + std::to_string(++floods_)) {
    // `timeout` as a last resort: the client bounds every wait itself.
    const std::string cmd = "timeout -k 5 " + std::to_string(hold_seconds + 60) +
                            " python3 " SOURCE_DIR "/tests/e2e/flood_client.py " + mode +
                            " 127.0.0.1 " + std::to_string(t.s.port) + " --hold " +
                            std::to_string(hold_seconds) + " --ready " + ready_file_ + " " +
                            options;
    output_ = std::async(std::launch::async, [cmd] { return run_capture(cmd); });
  }
  // Whether every connection of the flood has been opened once (the flood is in place).
  bool ready() {
    const auto exists = [&] { return access(ready_file_.c_str(), F_OK) == 0; };
    wait_until([&] { return exists() || output_.wait_for(0s) == std::future_status::ready; }, 30s);
    return exists();
  }
  // The client's counts once it has finished; {"error": output} if it printed none.
  json report() {
    const std::string out = output_.get();
    // The counts are the last line.
    const auto last = out.find_last_not_of('\n');
    const auto start = last == std::string::npos ? 0 : out.rfind('\n', last) + 1;
    const json r = json::parse(out.substr(start), nullptr, false);
    if (r.is_discarded() || !r.is_object()) return json{{"error", out}};
    return r;
  }

 private:
  static inline int floods_ = 0;
  std::string ready_file_;
  std::future<std::string> output_;
};

long number(const json& r, const char* key) { return r.value(key, -1L); }
double seconds(const json& r, const char* key) { return r.value(key, 1e9); }

// How long the flood client may see a connection open: request_timeout, the server's slack,
// and how late the client itself noticed things in this run (its longest loop turn, which a
// loaded machine stretches).
double open_budget(const json& r) {
  return kRequestTimeout + kDeadlineSlack + seconds(r, "max_loop_gap_seconds");
}

// A flood of `mode` for `hold_seconds`, with good scrapes while it is in place.
json flood_with_good_scrapes(const WebDaemon& t, const std::string& mode,
                             const std::string& options, int hold_seconds, int scrapes) {
  Flood flood(t, mode, options, hold_seconds);
  const bool ready = flood.ready();
  CHECK(ready);
  if (ready) check_good_scrapes(t, scrapes, 500ms);
  return flood.report();
}

// A flood of `slots` connections from many addresses: the server held every one (so the good
// scrapes competed with all of them) and closed each soon after request_timeout, whatever it
// was sending.
void check_held_then_cut(const json& r, long slots) {
  INFO("flood client: " << r.dump());
  REQUIRE_FALSE(r.contains("error"));
  CHECK(number(r, "connect_failed") == 0);
  CHECK(number(r, "closed_early") == 0);
  CHECK(number(r, "peak_held") >= slots * 9 / 10);
  // The first connection of every slot, at least, ended within the flood.
  CHECK(number(r, "held_then_closed") >= slots);
  CHECK(seconds(r, "max_open_seconds") < open_budget(r));
}

}  // namespace

TEST_CASE("TLS clients that reset at every stage leave the daemon serving", "[hostile]") {
  WebDaemon t;
  for (const std::string mode : {"reset-in-handshake", "reset-after-handshake", "reset-mid-request",
                                 "reset-after-request", "close-after-request"}) {
    INFO("hostile client: " << mode << "\ndaemon log:\n" << t.d->log());
    auto hostile = std::async(std::launch::async, [&] { return t.hostile(mode, 50); });
    // A good scrape while they run.
    CHECK(t.good_scrape_status() == "200");
    CHECK(hostile.get() == 0);
    CHECK(t.d->wait_exit(0ms) == -1);  // still running
    CHECK(t.good_scrape_status() == "200");
  }
}

TEST_CASE("downloads aborted mid-way, plain and TLS, leave the daemon serving", "[hostile]") {
  WebDaemon t;
  for (int i = 0; i < 20; ++i) {
    // curl gives up once the body passes 100 bytes: the server is left writing to a closed
    // connection.
    run_command("curl -sk -o /dev/null --max-filesize 100 " + t.base + "/metrics");
  }
  INFO("daemon log:\n" << t.d->log());
  CHECK(t.d->wait_exit(0ms) == -1);
  CHECK(t.good_scrape_status() == "200");
}

TEST_CASE(
    "slowloris: 1000 connections from 100 addresses dripping a byte every 2 s are cut "
    "at request_timeout and do not delay scrapes",
    "[hostile]") {
  bool tls = false;
  SECTION("plain HTTP") { tls = false; }
  SECTION("TLS, dripping after the handshake") { tls = true; }
  WebDaemon t({.tls = tls, .web_keys = kRequestTimeoutKey});
  // 10 per address: well under max_connections_per_address (default 32). A byte every 2 s,
  // sooner than request_timeout: a timeout that each byte restarted would never end them.
  const json r = flood_with_good_scrapes(
      t, "drip",
      std::string("--count 1000 --sources 100 --drip 2 --early 1.5") + (tls ? " --tls" : ""), 9, 6);
  check_held_then_cut(r, 1000);
  // Connections that dripped, each then closed within the time check_held_then_cut allows.
  // Plain: every connection sends its first byte as it connects. TLS: only once its handshake
  // is done, and a client starved of CPU may still be in the handshake of many when the
  // server cuts them (that is the stalled-handshake case): some dripped, at any speed.
  if (!tls) CHECK(number(r, "bytes_sent") >= 1000);
  CHECK(number(r, "dripped_then_closed") >= 1);
  check_alive_and_serving(t);
}

TEST_CASE(
    "slowloris from one address: at most max_connections_per_address are held and the "
    "rest closed at once",
    "[hostile]") {
  constexpr long kPerAddress = 20;
  WebDaemon t({.tls = false,
               .web_keys = std::string(kRequestTimeoutKey) +
                           "  max_connections_per_address: " + std::to_string(kPerAddress) + "\n"});
  // A refused slot tries again after a drip interval: about 500 connections a second. A
  // held connection lives at least request_timeout from its connect() call, a refused one
  // only as long as the client takes to notice: --early just under request_timeout tells
  // them apart however slow the client is to notice.
  const json r = flood_with_good_scrapes(
      t, "drip", "--count 1000 --sources 1 --drip 2 --early 2.5 --reopen 2", 9, 6);
  INFO("flood client: " << r.dump());
  REQUIRE_FALSE(r.contains("error"));
  CHECK(number(r, "peak_held") <= kPerAddress);
  CHECK(number(r, "peak_held") >= 1);
  // The first round alone: 1000 connections of which at most kPerAddress were kept.
  CHECK(number(r, "closed_early") >= 1000 - kPerAddress);
  CHECK(number(r, "held_then_closed") >= 1);
  CHECK(seconds(r, "max_open_seconds") < open_budget(r));
  check_alive_and_serving(t);
}

TEST_CASE(
    "idle flood: 1000 connections that send nothing are cut at request_timeout and do "
    "not delay scrapes",
    "[hostile][sanitize]") {
  bool tls = false;
  SECTION("plain HTTP") { tls = false; }
  SECTION("TLS: the handshake never starts") { tls = true; }
  WebDaemon t({.tls = tls, .web_keys = kRequestTimeoutKey});
  const json r = flood_with_good_scrapes(t, "idle", "--count 1000 --sources 100 --early 1.5", 8, 5);
  check_held_then_cut(r, 1000);
  check_alive_and_serving(t);
}

TEST_CASE(
    "stalled TLS handshakes: 200 clients that send half a ClientHello are cut at "
    "request_timeout and do not delay scrapes",
    "[hostile]") {
  WebDaemon t({.tls = true, .web_keys = kRequestTimeoutKey});
  const json r =
      flood_with_good_scrapes(t, "partial-hello", "--count 200 --sources 20 --early 1.5", 8, 5);
  check_held_then_cut(r, 200);
  check_alive_and_serving(t);
}

TEST_CASE("bcrypt flood: 150 clients guessing passwords do not delay an authorized scraper",
          "[hostile]") {
  // The constructor's scrape has passed bcrypt once: from then on the scraper is remembered.
  WebDaemon t({.tls = false, .web_keys = "", .basic_auth = true});
  // 15 per address, within max_connections_per_address; each client asks again as soon as it
  // is answered, alternating the configured user with a wrong password and unknown users.
  const json r = flood_with_good_scrapes(
      t, "wrong-password", std::string("--count 150 --sources 10 --reopen 0 --user ") + kUser, 12,
      8);
  INFO("flood client: " << r.dump());
  REQUIRE_FALSE(r.contains("error"));
  const json statuses = r.value("statuses", json::object());
  // Each 401 cost the server a bcrypt at cost 10: enough of them show the flood was real.
  CHECK(statuses.value("401", 0L) >= 20);
  CHECK(r.value("no_answer", 0L) == 0);  // every guess is answered, none left hanging
  for (const auto& [status, n] : statuses.items()) {
    // Never let in, never an error; 503 is the server shedding checks it has no room to queue.
    INFO("status " << status << " x " << n);
    CHECK((status == "401" || status == "503"));
  }
  check_alive_and_serving(t);
}

TEST_CASE("malformed Authorization headers are answered 401 also while hammered",
          "[hostile][sanitize]") {
  WebDaemon t({.tls = false, .web_keys = "", .basic_auth = true});
  const std::string user = kUser;
  const std::string right = "Authorization: Basic " + base64(user + ":" + kPassword) + "\r\n";
  const std::string wrong = "Authorization: Basic " + base64(user + ":not-it") + "\r\n";
  // Every one of these must be 401: never 200 (let in), never 500.
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"Basic ====", "Authorization: Basic ====\r\n"},
      {"not base64", "Authorization: Basic %%not*base64!!\r\n"},
      // bcrypt reads a password only up to a NUL: this would pass as the right one.
      {"right password, NUL, junk", "Authorization: Basic " +
                                        base64(user + ":" + kPassword + std::string("\0junk", 5)) +
                                        "\r\n"},
      {"over 1 KiB decoded",
       "Authorization: Basic " + base64(user + ":" + kPassword + std::string(1100, 'x')) + "\r\n"},
      {"Bearer", "Authorization: Bearer x\r\n"},
      {"empty value", "Authorization: \r\n"},
      {"Basic without credentials", "Authorization: Basic\r\n"},
      // Which of two a server or a proxy in front of it takes is anyone's guess.
      {"two headers, right then wrong", right + wrong},
      {"two headers, wrong then right", wrong + right},
      {"two headers, both right", right + right},
  };
  // A raw NUL byte in the header line, between wrong credentials and right ones: libmicrohttpd
  // ends the value at the NUL, and what follows must not count. Refusing the request (400) is
  // as good as 401.
  const std::string raw_nul =
      wrong.substr(0, wrong.size() - 2) + std::string(1, '\0') + right.substr(right.find("Basic "));

  CHECK(http_get(t.s.port, "/metrics", right).status == 200);
  CHECK(http_get(t.s.port, "/metrics").status == 401);
  for (const auto& [name, header] : malformed) {
    INFO("Authorization: " << name);
    CHECK(http_get(t.s.port, "/metrics", header).status == 401);
  }
  {
    const int status = http_get(t.s.port, "/metrics", raw_nul).status;
    INFO("raw NUL in the header line: " << status);
    CHECK((status == 401 || status == 400));
  }

  // The same from two clients in a loop, while the good scrapes run.
  std::atomic<bool> stop{false};
  const auto hammer = [&] {
    std::map<std::string, int> unexpected;  // "case: status" -> times, for answers not 401
    long sent = 0;
    while (!stop) {
      for (const auto& [name, header] : malformed) {
        const int status = http_get(t.s.port, "/metrics", header).status;
        if (status != 401) ++unexpected[name + ": " + std::to_string(status)];
      }
      const int status = http_get(t.s.port, "/metrics", raw_nul).status;
      if (status != 401 && status != 400) ++unexpected["raw NUL: " + std::to_string(status)];
      sent += static_cast<long>(malformed.size()) + 1;
    }
    std::string listed;
    for (const auto& [what, times] : unexpected)
      listed += what + " x " + std::to_string(times) + "\n";
    return std::make_pair(sent, listed);
  };
  auto a = std::async(std::launch::async, hammer);
  auto b = std::async(std::launch::async, hammer);
  std::this_thread::sleep_for(300ms);
  check_good_scrapes(t, 6, 500ms);
  stop = true;
  for (auto* f : {&a, &b}) {
    const auto [sent, unexpected] = f->get();
    CHECK(sent > 100);
    CHECK(unexpected == "");
  }
  check_alive_and_serving(t);
}

TEST_CASE("100 parallel scrapers get only 200 or 503, and the daemon's RSS comes back within 5 MB",
          "[hostile]") {
  // Room for all of wrk's connections from 127.0.0.1 and for the good scrapes beside them:
  // this is about load, the limits have tests of their own.
  WebDaemon t(
      {.tls = false, .web_keys = "  max_requests: 120\n  max_connections_per_address: 200\n"});
  const auto rss_kib = [&] {
    const std::string status = read_file("/proc/" + std::to_string(t.d->pid()) + "/status");
    const auto at = status.find("VmRSS:");
    return at == std::string::npos ? 0L : std::stol(status.substr(at + 6));
  };
  for (int i = 0; i < 20; ++i) t.scrape_status();
  std::this_thread::sleep_for(1s);
  const long before = rss_kib();

  // wrk reports only "non-2xx"; this counts each status.
  const std::string script = t.s.dir + "/statuses.lua";
  std::ofstream(script) << R"(local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("statuses")) do total[status] = (total[status] or 0) + n end
  end
  for status, n in pairs(total) do io.write(string.format("status %d %d\n", status, n)) end
  local e = summary.errors
  io.write(string.format("errors %d %d %d %d\n", e.connect, e.read, e.write, e.timeout))
end
)";
  auto wrk = std::async(std::launch::async, [&] {
    return run_capture("timeout -k 5 60 wrk -t2 -c100 -d10s --timeout 20s --latency -s " + script +
                       " " + t.base + "/metrics 2>&1");
  });
  std::this_thread::sleep_for(1s);
  check_good_scrapes(t, 6, 500ms);
  const std::string out = wrk.get();
  INFO("wrk:\n" << out);
  std::map<int, long> statuses;
  long errors[4] = {-1, -1, -1, -1};  // connect, read, write, timeout
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string what;
    words >> what;
    if (what == "status") {
      int status = 0;
      long n = 0;
      words >> status >> n;
      statuses[status] += n;
    } else if (what == "errors") {
      words >> errors[0] >> errors[1] >> errors[2] >> errors[3];
    }
  }
  CHECK(statuses[200] > 100);
  for (const auto& [status, n] : statuses) {
    INFO("status " << status << " x " << n);
    CHECK((status == 200 || status == 503));
  }
  // Every request was answered: no connection refused, dropped or left hanging.
  CHECK(errors[0] == 0);
  CHECK(errors[1] == 0);
  CHECK(errors[2] == 0);
  CHECK(errors[3] == 0);

  // What the burst took comes back (large blocks mapped on their own, arenas trimmed).
  const long right_after = rss_kib();
  long after = right_after;
  wait_until(
      [&] {
        after = rss_kib();
        return after - before < 5 * 1024;
      },
      30s);
  INFO("VmRSS before " << before << " KiB, right after " << right_after << " KiB, then " << after
                       << " KiB");
  CHECK(before > 0);
  CHECK(after - before < 5 * 1024);
  check_alive_and_serving(t);
}
