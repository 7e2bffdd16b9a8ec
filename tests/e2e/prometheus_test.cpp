// The daemon scraped by two real Prometheus servers (Debian's 2.42) at once, with the shipped
// rules: one classic (text format, classic buckets), one with native histograms (protobuf,
// native buckets only). In both every query of the dashboard and the rules must evaluate
// without error and return data, the recorded series must be the same, and quantiles of the
// same counts must fall in the same bucket.
#include <fcntl.h>
#include <netinet/in.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "../cgroup_fixture.h"
#include "../kernel_fixtures.h"
#include "../slow_reads.h"
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
  // The result vector of an instant query (empty on error).
  json result(const std::string& expr) {
    const json r = get("query", {{"query", expr}});
    if (r.is_discarded() || !r.is_object() || r.value("status", "") != "success")
      return json::array();
    return r["data"]["result"];
  }

 private:
  int port_;
  std::string dir_;
};

// What an alert's expression compares against its threshold: the part that must have data
// even when the alert does not fire.
std::string without_threshold(const std::string& expr) {
  static const std::regex threshold(R"(\s*(>=|<=|==|!=|>|<)\s*[0-9.eE+-]+\s*$)");
  return std::regex_replace(expr, threshold, "");
}

struct Query {
  std::string where;  // "dashboard: <panel>", "rule: <name>"
  std::string expr;
  bool classic = true;  // asked of the classic server
  bool native = true;   // asked of the native one
};

// A Prometheus server scraping `instance` every second with the shipped rules.
struct PrometheusServer {
  PrometheusServer(const Setup& s, const std::string& instance, bool native_histograms,
                   const std::vector<std::string>& features = {})
      : native(native_histograms),
        dir(s.dir + (native ? "/native" : "/classic")),
        port(free_port()),
        api(port, dir) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "rule_files:\n  - " SOURCE_DIR "/packaging/prometheus/rules.yml\n"
        << "scrape_configs:\n  - job_name: ebpf-metricsd\n    static_configs:\n"
        << "      - targets: ['" << instance << "']\n";
    std::vector<std::string> args = {
        "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/tsdb",
        "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"};
    if (native) args.push_back("--enable-feature=native-histograms");
    for (const std::string& f : features) args.push_back("--enable-feature=" + f);
    process = std::make_unique<DaemonProcess>("/usr/bin/prometheus", dir + "/prometheus.log",
                                              DaemonProcess::Options{args, false, {}, {}});
  }
  ~PrometheusServer() {
    kill(process->pid(), SIGTERM);
    process->wait_exit(10s);
  }
  std::string name() const { return native ? "native" : "classic"; }

  bool native;
  std::string dir;
  int port;
  PrometheusApi api;
  std::unique_ptr<DaemonProcess> process;
};

// The label sets of a recorded series, as text, sorted.
std::set<std::string> label_sets(const json& result) {
  std::set<std::string> out;
  for (const auto& r : result) out.insert(r["metric"].dump());
  return out;
}

// The classic bucket of a quantile: the exponent e of its bucket (2^(e-1), 2^e], the first
// bucket taking everything at or below 2^min_exp.
int classic_bucket(double q, int min_exp) {
  return std::max(static_cast<int>(std::ceil(std::log2(q) - 1e-12)), min_exp);
}

}  // namespace

TEST_CASE(
    "real Prometheus servers, classic and native, scrape the daemon; every dashboard and "
    "rule query has data in both") {
  if (run_command("command -v prometheus >/dev/null") != 0) {
    FAIL("prometheus is not installed (packaging/install-deps.sh --with-tests)");
  }
  // A series limit that the syscall histogram (one label set per syscall) runs into, so the
  // status row's series_limited query has data too. Workload labels on every tracer that
  // has them, for the dashboard's Workloads row.
  Setup s(replace_all(all_tracers_labelled(), "  syscall_latency:\n    enabled: true\n",
                      "  syscall_latency:\n    enabled: true\n    per_syscall: all\n"));
  s.prepend("max_series: 25\n");
  DaemonProcess daemon(daemon_path(), s.log, {s.args(), false, {}, {}});
  const std::string instance = "127.0.0.1:" + std::to_string(s.port);
  REQUIRE(wait_until([&] { return http_get(s.port, "/metrics").status == 200; }, 30s));

  PrometheusServer classic(s, instance, false);
  PrometheusServer native(s, instance, true);
  PrometheusServer* servers[] = {&classic, &native};

  // Activity for every tracer, all along: syscalls, scheduling, faults and kmalloc come by
  // themselves; TCP connects that succeed and fail; loopback packets; a loop device read and
  // written with O_DIRECT; a file read cold from disk.
  LoopDevice loop;
  {
    // One OOM kill, in a memory-limited cgroup, for the OOM panel: once the tracer is up
    // (tracers attach one after another after the server started).
    REQUIRE(wait_until(
        [&] {
          return http_get(s.port, "/metrics")
                     .body.find(
                         "ebpf_metricsd_tracer_up{tracer=\"oom_kills\",hook=\"tp_btf\"} 1") !=
                 std::string::npos;
        },
        30s));
    TestCgroup cg("e2e-oom");
    MemoryLimit limit(cg);
    const int status = cg.run_status([&] {
      limit.enter();
      exceed_memory_limit();
    });
    REQUIRE(WIFSIGNALED(status));
  }
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

  // Every expression of the dashboard, with its variables set as Grafana would. A heatmap
  // has a target for classic buckets (A) and one for the native histogram (B).
  std::vector<Query> queries;
  const json dash = json::parse(read_file(SOURCE_DIR "/dashboards/ebpf-metricsd.json"));
  for (const auto& panel : dash["panels"]) {
    if (!panel.contains("targets")) continue;
    const bool heatmap = panel["type"] == "heatmap";
    for (const auto& t : panel["targets"]) {
      std::string expr = t["expr"];
      expr = replace_all(expr, "$instance", instance);
      expr = replace_all(expr, "$__rate_interval", "1m");
      expr = replace_all(expr, "$workload", ".+");  // "All"
      const bool native_target = heatmap && t["refId"] == "B";
      queries.push_back({"dashboard: " + panel["title"].get<std::string>(), expr,
                         !heatmap || !native_target, !heatmap || native_target});
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

  // Wait until every query has data on both servers (or time is up), then report each that
  // has none.
  std::map<std::string, std::string> failing;
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  do {
    std::this_thread::sleep_for(2s);
    failing.clear();
    for (auto* server : servers) {
      for (const auto& q : queries) {
        if (!(server->native ? q.native : q.classic)) continue;
        const auto [error, series] = server->api.query(q.expr);
        const std::string where = server->name() + " " + q.where + ": " + q.expr;
        if (!error.empty()) {
          failing[where] = "error: " + error;
        } else if (series == 0) {
          failing[where] = "no data";
        }
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

  // What each server stored: classic buckets, or native histograms and no classic buckets.
  for (auto* server : servers) {
    INFO(server->name());
    auto& api = server->api;
    const json native_series = api.result("ebpf_syscall_latency_seconds");
    const json bucket_series = api.result("ebpf_syscall_latency_seconds_bucket");
    if (server->native) {
      REQUIRE(!native_series.empty());
      CHECK(native_series[0].contains("histogram"));
      CHECK(bucket_series.empty());
      CHECK(api.result("ebpf_syscall_latency_seconds_count").empty());
    } else {
      CHECK(native_series.empty());
      CHECK(!bucket_series.empty());
    }
  }

  // The loop device is idle from now on: wait until both servers hold the same count of its
  // requests, unchanged over a few of their scrapes (they have scraped the last of the
  // activity), however late a busy machine's drains and scrapes come.
  const std::string loop_device = loop.dev().substr(loop.dev().rfind('/') + 1);
  const auto stored_count = [&](PrometheusServer& server) {
    const std::string sel = "{device=\"" + loop_device + "\"}";
    const json r =
        server.native
            ? server.api.result("histogram_count(sum(ebpf_block_io_latency_seconds" + sel + "))")
            : server.api.result("sum(ebpf_block_io_latency_seconds_count" + sel + ")");
    return r.size() == 1 ? r[0]["value"][1].get<std::string>() : std::string("none");
  };
  std::string settled;
  int same = 0;
  const bool idle_everywhere = wait_until(
      [&] {
        std::this_thread::sleep_for(1s);  // a scrape apart
        const std::string now = stored_count(classic) + " " + stored_count(native);
        same = now == settled ? same + 1 : 0;
        settled = now;
        return same >= 3 && stored_count(classic) == stored_count(native);
      },
      60s);
  INFO("loop device requests stored (classic, native): " << settled);
  REQUIRE(idle_everywhere);

  // The recorded series are the same in both modes: same names, same label sets.
  for (const auto& group : rules["groups"]) {
    for (const auto& rule : group["rules"]) {
      if (!rule["record"]) continue;
      const std::string name = rule["record"].as<std::string>();
      INFO("recorded: " << name);
      std::set<std::string> a, b;
      for (int attempt = 0; attempt < 10; ++attempt) {  // a new label set may be a scrape apart
        a = label_sets(classic.api.result(name));
        b = label_sets(native.api.result(name));
        if (a == b) break;
        std::this_thread::sleep_for(1s);
      }
      CHECK(!a.empty());
      CHECK(a == b);
    }
  }

  // histogram_quantile on the native series falls in the bucket it falls in on the classic
  // buckets, for the loop device's reads and writes (counts frozen since the activity ended).
  const std::string& device = loop_device;
  int compared = 0;
  for (const char* op : {"read", "write"}) {
    const std::string sel = "{device=\"" + device + "\",op=\"" + op + "\"}";
    for (const char* q : {"0.1", "0.5", "0.9", "0.99"}) {
      const json c = classic.api.result("histogram_quantile(" + std::string(q) +
                                        ", ebpf_block_io_latency_seconds_bucket" + sel + ")");
      const json n = native.api.result("histogram_quantile(" + std::string(q) +
                                       ", ebpf_block_io_latency_seconds" + sel + ")");
      REQUIRE(c.size() == 1);
      REQUIRE(n.size() == 1);
      const double cq = std::stod(c[0]["value"][1].get<std::string>());
      const double nq = std::stod(n[0]["value"][1].get<std::string>());
      INFO(op << " q" << q << ": classic " << cq << ", native " << nq);
      REQUIRE(std::isfinite(cq));
      REQUIRE(std::isfinite(nq));
      CHECK(classic_bucket(cq, -17) == classic_bucket(nq, -17));  // block_io: min 8us = 2^-17
      ++compared;
    }
  }
  CHECK(compared == 8);

  for (auto* server : servers) {
    INFO(server->name());
    auto& api = server->api;
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
  }

  kill(daemon.pid(), SIGTERM);
  CHECK(daemon.wait_exit(5s) == 0);
}

TEST_CASE(
    "Prometheus with exemplar storage: slow reads and writes in known functions are exemplars "
    "on their buckets (as syscalls, off-CPU waits and block requests), and their stack_id leads "
    "through the daemon to that function",
    "[slow]") {
  if (run_command("command -v prometheus >/dev/null") != 0) {
    FAIL("prometheus is not installed (packaging/install-deps.sh --with-tests)");
  }
  LoopDevice loop;
  Setup s(
      "  syscall_latency:\n    enabled: true\n    include: [read]\n"
      "    slow: {threshold: 10ms, max_per_second: 1000}\n"
      "  offcpu_time:\n    enabled: true\n    comm: true\n"
      "    slow: {threshold: 100ms, max_per_second: 1000}\n"
      "  block_io:\n    enabled: true\n"
      "    slow: {threshold: 1us, max_per_second: 1000}\n");
  DaemonProcess daemon(daemon_path(), s.log, {s.args(), false, {}, {}});
  const std::string instance = "127.0.0.1:" + std::to_string(s.port);
  REQUIRE(wait_until(
      [&] { return !run_capture("curl -sf http://" + instance + "/metrics").empty(); }, 20s));
  PrometheusServer prometheus(s, instance, false, {"exemplar-storage"});
  REQUIRE(wait_until([&] { return prometheus.api.query("up == 1").second == 1; }, 60s));

  const double start =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The exemplars of `query` from process `pid`, once Prometheus has them, each in its bucket,
  // at least `min_seconds`, and leading through the daemon to a stack that names `function`,
  // taken where `taken` says (the pprof label `stack`: at_return, at_start).
  const auto check_exemplars = [&](const std::string& query, pid_t pid, double min_seconds,
                                   const std::string& function, const std::string& taken) {
    INFO(query);
    json found = json::array();
    const bool seen = wait_until(
        [&] {
          const json r =
              prometheus.api.get("query_exemplars", {{"query", query},
                                                     {"start", std::to_string(start - 1)},
                                                     {"end", std::to_string(start + 600)}});
          found = json::array();
          if (r.is_discarded() || r.value("status", "") != "success") return false;
          for (const auto& series : r["data"]) {
            for (const auto& e : series["exemplars"]) {
              if (e["labels"].value("pid", "") == std::to_string(pid)) {
                found.push_back({{"le", series["seriesLabels"].value("le", "")},
                                 {"value", e["value"]},
                                 {"stack_id", e["labels"].value("stack_id", "")}});
              }
            }
          }
          return !found.empty();
        },
        60s);
    INFO(prometheus.process->log() << daemon.log());
    REQUIRE(seen);
    INFO(found.dump());
    for (const auto& e : found) {
      // In the right bucket: at most its bound, more than half of it.
      const double value = std::stod(e["value"].get<std::string>());
      const double le = std::stod(e["le"].get<std::string>());
      CHECK(value >= min_seconds);
      CHECK(value <= le);
      CHECK(value > le / 2);
      // The stack behind it, from the daemon, names the function that made the call.
      const std::string file = s.dir + "/slow.pb.gz";
      REQUIRE(run_capture("curl -s -o " + file + " -w '%{http_code}' 'http://" + instance +
                          "/debug/pprof/slow?stack_id=" + e["stack_id"].get<std::string>() + "'") ==
              "200");
      const std::string raw =
          run_capture("HOME=" + s.dir + " go tool pprof -raw -symbolize=none " + file + " 2>&1");
      INFO(raw.substr(0, 3000));
      CHECK_THAT(raw, Catch::Matchers::Contains("events/count latency/nanoseconds[dflt]"));
      CHECK_THAT(raw, Catch::Matchers::Contains(function));
      CHECK_THAT(raw, Catch::Matchers::Contains("pid:[" + std::to_string(pid) + "]"));
      CHECK_THAT(raw, Catch::Matchers::Contains("stack:[" + taken + "]"));
      // The shipped Grafana data source's exemplar link, filled in as Grafana does, opens the
      // flame graph page; the page's data for it draws that stack.
      const YAML::Node ds = YAML::LoadFile(SOURCE_DIR "/packaging/grafana/datasource.yml");
      std::string link = ds["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"][0]["url"]
                             .as<std::string>();
      link = replace_all(link, "${__data.fields.instance}", instance);
      link = replace_all(link, "${__value.raw}", e["stack_id"].get<std::string>());
      CHECK(run_capture("curl -s -o /dev/null -w '%{http_code}' '" + link + "'") == "200");
      const std::string data_url = replace_all(link, "/profile?", "/profile/data?");
      REQUIRE(data_url != link);
      const json graph = json::parse(run_capture("curl -s '" + data_url + "'"), nullptr, false);
      REQUIRE(graph.is_object());
      CHECK(graph.value("slow", 0) >= 1);
      CHECK_THAT(graph.dump(), Catch::Matchers::Contains(function));
    }
  };

  // 300 ms: longer than any read this test's own harness makes (its curl pipes), so no
  // other event takes the read bucket's exemplar between two scrapes; the off-CPU series
  // of the reader's comm are its alone.
  SlowReader reader(5, std::chrono::milliseconds(300));
  check_exemplars("ebpf_syscall_latency_seconds_bucket{syscall=\"read\"}", reader.pid(), 0.3,
                  "slow_read_in_known_function", "at_return");
  check_exemplars("ebpf_offcpu_seconds_bucket{comm=\"" + std::string(SlowReader::kComm) + "\"}",
                  reader.pid(), 0.3, "slow_read_in_known_function", "at_return");
  CHECK(reader.finish() == 0);

  // Direct writes to a loop device nothing else writes to: at 1 us every request is slow.
  // The newest request of a bucket is its exemplar: the writer's, where the loop driver
  // issues a direct write in the writer's context (6.12 and later; these machines), sent
  // when its write returns.
  DirectWriter writer(loop.dev(), 20);
  check_exemplars(
      "ebpf_block_io_latency_seconds_bucket{device=\"" + loop.name() + "\",op=\"write\"}",
      writer.pid(), 0, "write_in_known_function", "at_return");
  CHECK(writer.finish() == 0);
}
