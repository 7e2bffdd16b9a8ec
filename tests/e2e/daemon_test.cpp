// The built daemon end to end: config file in, /metrics over HTTP out, clean exit.
#include <dirent.h>
#include <sys/syscall.h>

#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "daemon_process.h"
#include "ebpf_metricsd/daemon/daemon.h"
#include "ebpf_metricsd/http/server.h"

using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

TEST_CASE("daemon serves real syscall latencies, passes promtool, exits cleanly",
          "[sizing][sanitize]") {
  Setup s;
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  REQUIRE(wait_until(
      [&] {
        return http_get(s.port, "/metrics")
                   .body.find(
                       "ebpf_metricsd_tracer_up{tracer=\"syscall_latency\",hook=\"tp_btf\"} 1") !=
               std::string::npos;
      },
      20s));

  const auto progs = bpf_ids(d.pid(), "prog_id");
  const auto maps = bpf_ids(d.pid(), "map_id");
  CHECK(progs.size() >= 2);  // sys_enter + sys_exit
  CHECK(!maps.empty());

  const std::string getppid_count = "ebpf_syscall_latency_seconds_count{syscall=\"getppid\"}";
  const double before = sample(http_get(s.port, "/metrics").body, getppid_count).value_or(0);
  constexpr int kCalls = 20000;
  for (int i = 0; i < kCalls; ++i) syscall(SYS_getppid);
  std::string body;
  REQUIRE(wait_until(
      [&] {
        body = http_get(s.port, "/metrics").body;
        return sample(body, getppid_count).value_or(0) - before >= kCalls;
      },
      30s));
  const double got = *sample(body, getppid_count) - before;
  CHECK(got <= kCalls + kCalls / 100);
  const std::string inf = "ebpf_syscall_latency_seconds_bucket{syscall=\"getppid\",le=\"+Inf\"}";
  CHECK(sample(body, inf) == sample(body, getppid_count));
  // Bounds are powers of two of seconds, printed exactly: 2^-20 s .. 2^4 s by default.
  CHECK(sample(
      body, "ebpf_syscall_latency_seconds_bucket{syscall=\"getppid\",le=\"9.5367431640625e-07\"}"));
  CHECK(sample(body, "ebpf_syscall_latency_seconds_bucket{syscall=\"getppid\",le=\"0.5\"}"));
  CHECK(sample(body, "ebpf_syscall_latency_seconds_bucket{syscall=\"getppid\",le=\"16\"}"));
  CHECK(sample(body, "ebpf_syscall_latency_seconds_sum{syscall=\"getppid\"}").value_or(0) > 0);
  CHECK_THAT(body, Contains("# TYPE ebpf_syscall_latency_seconds histogram"));
  CHECK(sample(body, "ebpf_metricsd_build_info{version=\"" EBPF_METRICSD_VERSION "\"}") == 1.0);
  CHECK(sample(body, "ebpf_metricsd_drain_duration_seconds{tracer=\"syscall_latency\"}"));
  CHECK(sample(body,
               "ebpf_metricsd_dropped_events_total{tracer=\"syscall_latency\",reason=\"map_"
               "full\"}") == 0.0);

  std::ofstream(s.dir + "/metrics.txt") << body;
  CHECK(run_command("promtool check metrics < " + s.dir + "/metrics.txt") == 0);

  // Counters never go down between scrapes.
  const std::string next = http_get(s.port, "/metrics").body;
  CHECK(sample(next, getppid_count).value_or(0) >= *sample(body, getppid_count));

  const auto landing = http_get(s.port, "/");
  CHECK(landing.status == 200);
  CHECK_THAT(landing.body,
             Contains("href=\"/metrics\"") && Contains("syscall_latency") && Contains("tp_btf"));
  CHECK(http_get(s.port, "/nope").status == 404);
  // Drains succeed, so the health check (the Kubernetes liveness probe) passes.
  CHECK(http_get(s.port, "/-/healthy").status == 200);
  CHECK(http_get(s.port, "/metrics/extra").status == 404);

  const auto t0 = std::chrono::steady_clock::now();
  kill(d.pid(), SIGTERM);
  const int status = d.wait_exit(5s);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(status == 0);
  CHECK(took < (sanitized() ? 5s : 1s));  // the sanitizers' leak check walks the heap at exit
  CHECK_THAT(d.log(), Contains("stopped: all tracers detached"));
  // Detaching is synchronous; the kernel frees the unreferenced programs after an RCU
  // grace period, so give it a moment before reading the list.
  const bool gone = wait_until(
      [&] {
        const auto still = loaded_prog_ids();
        for (int id : progs) {
          if (still.count(id)) return false;
        }
        return true;
      },
      3s);
  CHECK(gone);
}

namespace {
std::size_t thread_count(pid_t pid) {
  std::size_t n = 0;
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (!d) return 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}
}  // namespace

TEST_CASE(
    "the daemon's threads: the web server's pools sized for the cores, the same after a "
    "reload that restarts the server, far below TasksMax",
    "[sizing][sanitize]") {
  Setup s(all_tracers_enabled());
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  // Every tracer started (or failed) and the drain loop running.
  REQUIRE(wait_until([&] { return d.log().find("draining every") != std::string::npos; }, 60s));
  const unsigned web = ebpf_metricsd::web_server_threads();
  INFO(ebpf_metricsd::sizing_cores() << " cores for sizing: " << web << " web server threads");
  const std::size_t before = thread_count(d.pid());
  // Besides the web server's: main, the drain and a ring reader per tracer that has one,
  // and what the libraries start.
  CHECK(before >= web + 2);
  CHECK(before <= web + 32);
  CHECK(before < 256);  // TasksMax

  // A new max_requests restarts the server: the old one's threads all go.
  s.prepend("");
  std::string text = read_file(s.config);
  text.replace(text.find("web:\n"), 5, "web:\n  max_requests: 7\n");
  std::ofstream(s.config) << text;
  kill(d.pid(), SIGHUP);
  REQUIRE(
      wait_until([&] { return d.log().find("web server restarted") != std::string::npos; }, 30s));
  CHECK(http_get(s.port, "/metrics").status == 200);
  CHECK(wait_until([&] { return thread_count(d.pid()) == before; }, 10s));
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(10s) == 0);
}

namespace {
// The nice values of process `pid`'s threads (field 19 of each /proc/PID/task/TID/stat,
// counted after the command name's closing parenthesis).
std::multiset<int> thread_nice_values(pid_t pid) {
  std::multiset<int> values;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(task.c_str());
  if (!d) return values;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string stat = read_file(task + "/" + e->d_name + "/stat");
    const auto name_end = stat.rfind(')');
    if (name_end == std::string::npos || name_end + 2 > stat.size()) continue;  // gone
    std::istringstream fields(stat.substr(name_end + 2));
    std::string field;
    for (int i = 3; i < 19 && fields >> field; ++i) {
    }
    int nice = 100;
    if (fields >> nice) values.insert(nice);
  }
  closedir(d);
  return values;
}
}  // namespace

TEST_CASE("the daemon's threads run at the config's nice value, -10 by default; a reload sets it",
          "[sizing]") {
  Setup s;
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  REQUIRE(wait_until([&] { return d.log().find("draining every") != std::string::npos; }, 60s));
  // Every thread, the web server's and the drain's too (started after the value was set).
  std::multiset<int> values = thread_nice_values(d.pid());
  INFO("daemon log:\n" << d.log());
  REQUIRE(values.size() >= 3);
  CHECK(values.count(-10) == values.size());
  // A reload sets every thread's, those running included.
  s.prepend("nice: 5\n");
  kill(d.pid(), SIGHUP);
  REQUIRE(wait_until([&] { return d.log().find("reload done") != std::string::npos; }, 30s));
  values = thread_nice_values(d.pid());
  CHECK(values.count(5) == values.size());
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(10s) == 0);
}

TEST_CASE("a tracer that cannot load is reported and the daemon runs on") {
  Setup s;
  DaemonProcess d(daemon_path(), s.log, {s.args(), /*deny_bpf=*/true, {}, {}});
  INFO("daemon log:\n" << d.log());
  REQUIRE(wait_until(
      [&] {
        return http_get(s.port, "/metrics")
                   .body.find(
                       "ebpf_metricsd_tracer_up{tracer=\"syscall_latency\",hook=\"none\"} 0") !=
               std::string::npos;
      },
      20s));
  CHECK_THAT(d.log(), Contains("tracer syscall_latency failed to start") &&
                          Contains("Operation not permitted"));
  CHECK_THAT(http_get(s.port, "/").body, Contains("failed"));
  kill(d.pid(), SIGINT);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE("--strict makes a failed tracer fatal") {
  Setup s;
  auto args = s.args();
  args.push_back("--strict");
  DaemonProcess d(daemon_path(), s.log, {args, /*deny_bpf=*/true, {}, {}});
  CHECK(d.wait_exit(20s) == 1);
  CHECK_THAT(d.log(), Contains("--strict"));
}

TEST_CASE("--check-config and bad configs", "[sanitize]") {
  Setup good;
  CHECK(run_command(std::string(daemon_path()) + " --check-config --config " + good.config +
                    " > /dev/null 2>&1") == 0);
  CHECK(run_command(std::string(daemon_path()) + " --check-config --config " SOURCE_DIR
                                                 "/config/ebpf-metricsd.yaml > /dev/null 2>&1") ==
        0);

  Setup bad("  syscall_latency:\n    enabled: true\n    colour: blue\n");
  const std::string out = bad.dir + "/out.txt";
  CHECK(run_command(std::string(daemon_path()) + " --check-config --config " + bad.config + " > " +
                    out + " 2>&1") == 1);
  CHECK_THAT(read_file(out),
             Contains(bad.config + ":7:5: tracers.syscall_latency.colour: unknown key"));

  // A "billion laughs" alias bomb (10^10 values by reference in 1 KiB) is refused at its
  // first anchor, with file, line and key.
  {
    std::ofstream bomb(bad.dir + "/bomb.yaml");
    for (int level = 0; level < 10; ++level) {
      bomb << "l" << level << ": &l" << level << " [";
      for (int i = 0; i < 10; ++i)
        bomb << (i ? ", " : "") << (level ? "*l" + std::to_string(level - 1) : "read");
      bomb << "]\n";
    }
  }
  CHECK(run_command(std::string(daemon_path()) + " --check-config --config " + bad.dir +
                    "/bomb.yaml > " + out + " 2>&1") == 1);
  CHECK_THAT(read_file(out), Contains(bad.dir + "/bomb.yaml:1:5: l0: a YAML anchor (&name)"));

  // The daemon itself refuses to start on it, and serves nothing.
  DaemonProcess d(daemon_path(), bad.log, {bad.args(), false, {}, {}});
  CHECK(d.wait_exit(10s) == ebpf_metricsd::kExitConfigError);
  CHECK_THAT(d.log(), Contains("tracers.syscall_latency.colour: unknown key"));
  CHECK(http_get(bad.port, "/metrics").status == 0);
}

TEST_CASE("flags: --version, --help, unknown flags") {
  CHECK(run_command(std::string(daemon_path()) +
                    " --version | grep -q 'ebpf-metricsd " EBPF_METRICSD_VERSION "'") == 0);
  CHECK(run_command(std::string(daemon_path()) + " --help | grep -q -- '--web.listen-address'") ==
        0);
  CHECK(run_command(std::string(daemon_path()) + " --bogus > /dev/null 2>&1") == 2);
  CHECK(run_command(std::string(daemon_path()) + " --log.level loud > /dev/null 2>&1") == 2);
}

TEST_CASE("every tracer, with every optional label, up at once and valid for promtool",
          "[sanitize]") {
  // Every registered tracer, with `cgroup: true` where it is an option, and the other
  // optional labels below.
  const std::map<std::string, std::string> other_options = {
      {"runqueue_latency", "    comm: true\n"},
      {"kmalloc", "    caches: true\n"},
  };
  std::vector<std::string> tracers;
  std::string sections;
  for (const auto& desc : ebpf_metricsd::tracer_registry()) {
    tracers.push_back(desc.name);
    sections += "  " + desc.name + ":\n    enabled: true\n";
    if (desc.traits.owner == ebpf_metricsd::EventOwner::Task) sections += "    cgroup: true\n";
    if (const auto other = other_options.find(desc.name); other != other_options.end())
      sections += other->second;
  }
  Setup s(sections);
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  // Scraping over loopback TCP is itself a connect and packets on lo; the rest comes by itself.
  const std::vector<std::string> expected = {
      "ebpf_runqueue_latency_seconds_count{",
      "ebpf_syscall_latency_seconds_count{syscall=\"",
      "ebpf_page_faults_total{type=\"minor\",cgroup=\"",
      "ebpf_context_switches_total{kind=\"voluntary\"}",
      "ebpf_offcpu_seconds_bucket{cgroup=\"",
      "ebpf_kmalloc_size_bytes_bucket{le=\"8\"}",
      "ebpf_kmem_cache_alloc_calls_total{",
      "ebpf_page_cache_accesses_total{cgroup=\"",
      "ebpf_net_xmit_packets_total{interface=\"lo\",cgroup=\"",
      "ebpf_tcp_connect_latency_seconds_count{family=\"ipv4\",cgroup=\""};
  std::string body;
  const bool all_up = wait_until(
      [&] {
        body = http_get(s.port, "/metrics").body;
        for (const auto& t : tracers) {
          if (body.find("ebpf_metricsd_tracer_up{tracer=\"" + t + "\",hook=\"") ==
              std::string::npos) {
            return false;
          }
        }
        for (const auto& e : expected) {
          if (body.find(e) == std::string::npos) return false;
        }
        return true;
      },
      30s);
  INFO("daemon log:\n" << d.log());
  for (const auto& e : expected) {
    INFO("expected in the exposition: " << e);
    CHECK(body.find(e) != std::string::npos);
  }
  REQUIRE(all_up);
  for (const auto& t : tracers) {
    INFO("tracer " << t);
    CHECK(body.find("ebpf_metricsd_tracer_up{tracer=\"" + t + "\",hook=\"none\"} 0") ==
          std::string::npos);
  }
  std::ofstream(s.dir + "/metrics.txt") << body;
  CHECK(run_command("promtool check metrics < " + s.dir + "/metrics.txt") == 0);
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE("btf_path: every tracer loads where the kernel's own BTF cannot be read") {
  // The daemon runs in a mount namespace of its own where /sys/kernel/btf/vmlinux is an
  // empty file, as on a kernel built without BTF: no tp_btf, no fentry, no CO-RE from the
  // kernel. A copy of the BTF named by btf_path must bring every tracer up on raw_tp.
  for (const bool with_path : {false, true}) {
    INFO("btf_path " << (with_path ? "set" : "unset"));
    Setup s(all_tracers_enabled());
    const std::string copy = s.dir + "/vmlinux.btf", empty = s.dir + "/empty";
    REQUIRE(run_command("cp /sys/kernel/btf/vmlinux " + copy + " && : > " + empty) == 0);
    if (with_path) s.prepend("btf_path: " + copy + "\n");
    const std::vector<std::string> hide_btf = {
        "/usr/bin/unshare",
        "-m",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        "mount --bind " + empty + " /sys/kernel/btf/vmlinux && exec \"$@\"",
        "sh"};
    DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, hide_btf});
    std::string body;
    const auto up_line = [&](const std::string& tracer) {
      const std::string prefix = "ebpf_metricsd_tracer_up{tracer=\"" + tracer + "\",hook=\"";
      const auto at = body.find(prefix);
      return at == std::string::npos ? std::string() : body.substr(at, body.find('\n', at) - at);
    };
    const bool reported = wait_until(
        [&] {
          body = http_get(s.port, "/metrics").body;
          for (const auto& t : ebpf_metricsd::tracer_registry()) {
            if (up_line(t.name).empty()) return false;
          }
          return true;
        },
        30s);
    INFO("daemon log:\n" << d.log());
    REQUIRE(reported);
    if (with_path) {
      for (const auto& t : ebpf_metricsd::tracer_registry()) {
        const std::string hook = t.name == "page_faults" ? "perf_event" : "raw_tp";
        CHECK(up_line(t.name) ==
              "ebpf_metricsd_tracer_up{tracer=\"" + t.name + "\",hook=\"" + hook + "\"} 1");
      }
    } else {
      // Its raw_tp programs read the socket through CO-RE, which needs the BTF.
      CHECK(up_line("tcp_connect_latency") ==
            "ebpf_metricsd_tracer_up{tracer=\"tcp_connect_latency\",hook=\"none\"} 0");
    }
    kill(d.pid(), SIGTERM);
    CHECK(d.wait_exit(10s) == 0);
  }
}
