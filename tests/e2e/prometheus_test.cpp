// The daemon scraped by a real Prometheus (Debian's) with the shipped rules; every query of
// the dashboard and the rules must evaluate without error and return data.
#include <fcntl.h>
#include <netinet/in.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>

#include "../kernel_fixtures.h"
#include "../workloads.h"
#include "daemon_process.h"

using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;
using json = nlohmann::json;
using ebpf_metricsd::test::EvictedFile;
using ebpf_metricsd::test::LoopDevice;
namespace workload = ebpf_metricsd::workload;

namespace {

class PrometheusApi {
 public:
  PrometheusApi(int port, std::string dir) : port_(port), dir_(std::move(dir)) {}

  // GET /api/v1/<path> with url-encoded parameters; the parsed reply (null when none).
  json get(const std::string& path,
           const std::vector<std::pair<std::string, std::string>>& params = {}) {
    std::string args;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string file = dir_ + "/param" + std::to_string(i);
      std::ofstream(file) << params[i].second;
      args += " --data-urlencode '" + params[i].first + "@" + file + "'";
    }
    const std::string out = run_capture("curl -s --max-time 10 -G" + args + " http://127.0.0.1:" +
                                        std::to_string(port_) + "/api/v1/" + path);
    return json::parse(out, nullptr, /*allow_exceptions=*/false);
  }
  // An instant query: "" and the number of series, or the error.
  std::pair<std::string, std::size_t> query(const std::string& expr) {
    const json r = get("query", {{"query", expr}});
    if (r.is_discarded() || !r.is_object()) return {"no reply", 0};
    if (r.value("status", "") != "success") return {r.value("error", std::string("failed")), 0};
    return {"", r["data"]["result"].size()};
  }

 private:
  int port_;
  std::string dir_;
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

// What an alert's expression compares against its threshold: the part that must have data
// even when the alert does not fire.
std::string without_threshold(const std::string& expr) {
  static const std::regex threshold(R"(\s*(>=|<=|==|!=|>|<)\s*[0-9.eE+-]+\s*$)");
  return std::regex_replace(expr, threshold, "");
}

struct Query {
  std::string where;  // "dashboard: <panel>", "rule: <name>"
  std::string expr;
};

}  // namespace

TEST_CASE("a real Prometheus scrapes the daemon; every dashboard and rule query has data") {
  if (run_command("command -v prometheus >/dev/null") != 0) {
    FAIL("prometheus is not installed (packaging/install-deps.sh --with-tests)");
  }
  Setup s(all_tracers_enabled());
  // A series limit that the syscall histogram (one label set per syscall) runs into, so the
  // status row's series_limited query has data too.
  s.prepend("max_series: 25\n");
  DaemonProcess daemon(DAEMON_PATH, s.log, {s.args(), false, {}, {}});
  const std::string instance = "127.0.0.1:" + std::to_string(s.port);
  REQUIRE(wait_until([&] { return http_get(s.port, "/metrics").status == 200; }, 10s));

  const int prom_port = free_port();
  std::ofstream(s.dir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " SOURCE_DIR "/packaging/prometheus/rules.yml\n"
      << "scrape_configs:\n  - job_name: ebpf-metricsd\n    static_configs:\n"
      << "      - targets: ['" << instance << "']\n";
  DaemonProcess prometheus(
      "/usr/bin/prometheus", s.dir + "/prometheus.log",
      {{"--config.file=" + s.dir + "/prometheus.yml", "--storage.tsdb.path=" + s.dir + "/tsdb",
        "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
       false,
       {},
       {}});
  PrometheusApi api(prom_port, s.dir);

  // Activity for every tracer, all along: syscalls, scheduling, faults and kmalloc come by
  // themselves; TCP connects that succeed and fail; loopback packets; a loop device read and
  // written with O_DIRECT; a file read cold from disk.
  LoopDevice loop;
  std::atomic<bool> stop{false};
  std::thread activity([&] {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(listener, 128);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    sockaddr_in closed = addr;
    closed.sin_port = htons(static_cast<uint16_t>(free_port()));
    const int dev = open(loop.dev().c_str(), O_RDWR | O_DIRECT);
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, 4096) != 0) return;
    std::memset(buf, 0x5a, 4096);
    fcntl(listener, F_SETFL, O_NONBLOCK);
    while (!stop) {
      workload::tcp_connects(addr, 20);
      for (int c; (c = accept(listener, nullptr, nullptr)) >= 0;) close(c);
      workload::tcp_refused_connects(closed, 5);
      for (int i = 0; i < 20; ++i) {
        if (pwrite(dev, buf, 4096, i * 4096) != 4096 || pread(dev, buf, 4096, i * 4096) != 4096) {
          break;
        }
      }
      {
        EvictedFile cold(64, 'c');
        workload::cached_reads(cold.fd(), 1);
      }
      workload::touch_anon_pages(256);
      std::this_thread::sleep_for(200ms);
    }
    free(buf);
    close(dev);
    close(listener);
  });

  // Every expression of the dashboard, with its variables set as Grafana would.
  std::vector<Query> queries;
  const json dash = json::parse(read_file(SOURCE_DIR "/dashboards/ebpf-metricsd.json"));
  for (const auto& panel : dash["panels"]) {
    if (!panel.contains("targets")) continue;
    for (const auto& t : panel["targets"]) {
      std::string expr = t["expr"];
      expr = replace_all(expr, "$instance", instance);
      expr = replace_all(expr, "$__rate_interval", "1m");
      queries.push_back({"dashboard: " + panel["title"].get<std::string>(), expr});
    }
  }
  // Every rule: a recorded series must exist, and an alert's expression must evaluate and,
  // before its threshold, have data.
  std::size_t alerts = 0, records = 0;
  const YAML::Node rules = YAML::LoadFile(SOURCE_DIR "/packaging/prometheus/rules.yml");
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      const std::string expr = rule["expr"].as<std::string>();
      if (rule["record"]) {
        ++records;
        const std::string name = rule["record"].as<std::string>();
        queries.push_back({"rule: " + name, expr});
        queries.push_back({"recorded: " + name, name});
      } else {
        ++alerts;
        const std::string name = rule["alert"].as<std::string>();
        queries.push_back({"alert: " + name, without_threshold(expr)});
      }
    }
  }
  REQUIRE(queries.size() > 40);
  REQUIRE(alerts >= 9);
  REQUIRE(records >= 13);

  // Wait until every query has data (or time is up), then report each that has none.
  std::map<std::string, std::string> failing;
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  do {
    std::this_thread::sleep_for(2s);
    failing.clear();
    for (const auto& q : queries) {
      const auto [error, series] = api.query(q.expr);
      if (!error.empty()) {
        failing[q.where + ": " + q.expr] = "error: " + error;
      } else if (series == 0) {
        failing[q.where + ": " + q.expr] = "no data";
      }
    }
  } while (!failing.empty() && std::chrono::steady_clock::now() < deadline);
  stop = true;
  activity.join();
  INFO(queries.size() << " queries");
  for (const auto& [q, why] : failing) {
    INFO(q);
    CHECK(why == "");
  }
  CHECK(failing.empty());

  // The instance variable's query: label_values(ebpf_metricsd_build_info, instance).
  const json inst = api.get("label/instance/values", {{"match[]", "ebpf_metricsd_build_info"}});
  REQUIRE(inst.is_object());
  CHECK(inst["data"].size() == 1);
  CHECK(inst["data"][0] == instance);

  // The full alert expressions evaluate too (no data is fine: nothing is on fire).
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      if (!rule["alert"]) continue;
      INFO(rule["alert"].as<std::string>());
      CHECK(api.query(rule["expr"].as<std::string>()).first == "");
    }
  }
  // Prometheus: the target is healthy, no scrape failed or had a bad sample.
  const json targets = api.get("targets");
  REQUIRE(targets.is_object());
  const auto& active = targets["data"]["activeTargets"];
  REQUIRE(active.size() == 1);
  CHECK(active[0]["health"] == "up");
  CHECK(active[0]["lastError"] == "");
  for (const char* bad :
       {"up{job=\"ebpf-metricsd\"} == 0", "scrape_samples_post_metric_relabeling == 0",
        "sum(prometheus_target_scrapes_sample_out_of_order_total) > 0",
        "sum(prometheus_target_scrapes_sample_duplicate_timestamp_total) > 0",
        "sum(prometheus_target_scrapes_sample_out_of_bounds_total) > 0",
        "sum(prometheus_target_scrapes_exceeded_sample_limit_total) > 0",
        "sum(prometheus_rule_evaluation_failures_total) > 0"}) {
    INFO(bad);
    CHECK(api.query(bad) == std::pair<std::string, std::size_t>{"", 0});
  }

  kill(prometheus.pid(), SIGTERM);
  prometheus.wait_exit(10s);
  kill(daemon.pid(), SIGTERM);
  CHECK(daemon.wait_exit(5s) == 0);
}
