// The daemon as a service: systemd notifications, reload, journald priorities, least
// privilege, the unit file, and bounded memory and series under process churn.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "../cgroup_fixture.h"
#include "../workloads.h"
#include "daemon_process.h"
#include "ebpf_metricsd/daemon/daemon.h"
#include "ebpf_metricsd/http/basic_auth.h"

using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

// A NOTIFY_SOCKET that collects what the daemon sends with sd_notify.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~NotifySocket() { close(fd_); }
  // Every message so far, in order.
  const std::vector<std::string>& messages() {
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd_, buf, sizeof buf, 0)) > 0) messages_.emplace_back(buf, n);
    return messages_;
  }
  bool wait_for(const std::string& needle, std::size_t from = 0) {
    return wait_until(
        [&] {
          const auto& m = messages();
          for (std::size_t i = from; i < m.size(); ++i) {
            if (m[i].find(needle) != std::string::npos) return true;
          }
          return false;
        },
        30s);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_;
  std::vector<std::string> messages_;
};

std::string scrape(int port) { return http_get(port, "/metrics").body; }

std::size_t count_lines_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) n += line.compare(0, prefix.size(), prefix) == 0;
  return n;
}

// IDs of the programs the process holds whose name starts with `prefix`.
std::set<int> prog_ids_named(pid_t pid, const std::string& prefix) {
  std::set<int> out;
  for (int id : bpf_ids(pid, "prog_id")) {
    const std::string info = run_capture("bpftool prog show id " + std::to_string(id));
    if (info.find(" name " + prefix) != std::string::npos) out.insert(id);
  }
  return out;
}

// The system calls a systemd syscall group (or a single call) stands for, groups expanded.
std::set<std::string> expand_syscalls(const std::string& item) {
  if (item.empty() || item[0] != '@') return {item};
  std::set<std::string> out;
  std::istringstream in(run_capture("systemd-analyze syscall-filter " + item));
  std::string line;
  std::getline(in, line);  // the group's own name
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(' ');
    if (b == std::string::npos || line[b] == '#') continue;
    if (b == 0) break;  // the next group
    for (const auto& s : expand_syscalls(line.substr(b))) out.insert(s);
  }
  return out;
}

// The allow list the unit's SystemCallFilter= lines make: the first lists what is allowed,
// a "~" line takes calls away.
std::vector<std::string> unit_syscall_allow_list(const std::string& unit) {
  std::set<std::string> allowed;
  std::istringstream in(unit);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SystemCallFilter=", 0) != 0) continue;
    std::string value = line.substr(17);
    const bool deny = !value.empty() && value[0] == '~';
    if (deny) value = value.substr(1);
    std::istringstream words(value);
    std::string w;
    while (words >> w) {
      for (const auto& s : expand_syscalls(w)) {
        if (deny) {
          allowed.erase(s);
        } else {
          allowed.insert(s);
        }
      }
    }
  }
  return {allowed.begin(), allowed.end()};
}

long rss_kib(pid_t pid) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

TEST_CASE("reload: a bad file keeps the running config, a good one changes only what changed",
          "[sanitize]") {
  const std::string tracers_a =
      "  syscall_latency:\n    enabled: true\n    include: [getppid]\n    per_syscall: all\n"
      "  runqueue_latency:\n    enabled: true\n"
      "  page_faults:\n    enabled: true\n";
  Setup s(tracers_a);
  NotifySocket notify(s.dir + "/notify.sock");
  struct stat log_st {};
  // The log file is the daemon's stderr; tell it that stream is the journal.
  std::ofstream(s.log).flush();
  REQUIRE(stat(s.log.c_str(), &log_st) == 0);
  const std::string journal =
      "JOURNAL_STREAM=" + std::to_string(log_st.st_dev) + ":" + std::to_string(log_st.st_ino);
  DaemonProcess d(daemon_path(), s.log,
                  {s.args(), false, {"NOTIFY_SOCKET=" + notify.path(), journal}, {}});
  REQUIRE(notify.wait_for("READY=1"));
  CHECK_THAT(notify.messages().front(), Contains("STATUS=3/3 tracers up"));

  // Scrape all along: the getppid count must never go down, across both reloads.
  const std::string getppid = "ebpf_syscall_latency_seconds_count{syscall=\"getppid\"}";
  std::atomic<bool> stop{false};
  std::atomic<int> decreases{0}, scrapes{0};
  std::string seen;
  std::thread scraper([&] {
    double last = 0;
    while (!stop) {
      if (const auto v = sample(scrape(s.port), getppid)) {
        seen += std::to_string(static_cast<long>(*v)) + " ";
        if (*v < last) ++decreases;
        last = *v;
        ++scrapes;
      }
      for (int i = 0; i < 1000; ++i) syscall(SYS_getppid);
      std::this_thread::sleep_for(20ms);
    }
  });
  // A failed REQUIRE leaves this scope at once: the scraper must not outlive it unjoined.
  struct JoinOnExit {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~JoinOnExit() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } join_scraper{stop, scraper};
  REQUIRE(wait_until([&] { return sample(scrape(s.port), getppid).value_or(0) > 0; }, 30s));

  SECTION("an invalid file changes nothing") {
    std::ofstream(s.config, std::ios::app) << "    bogus_key: 1\n";
    const std::size_t before = notify.messages().size();
    kill(d.pid(), SIGHUP);
    REQUIRE(wait_until(
        [&] {
          return sample(scrape(s.port), "ebpf_metricsd_config_last_reload_successful") == 0.0;
        },
        30s));
    const std::string m = scrape(s.port);
    CHECK(sample(m, "ebpf_metricsd_tracer_up{tracer=\"page_faults\",hook=\"perf_event\"}") == 1);
    CHECK(sample(m, "ebpf_metricsd_tracer_up{tracer=\"syscall_latency\",hook=\"tp_btf\"}") == 1);
    // The old configuration goes on counting.
    const double at_failure = sample(m, getppid).value_or(0);
    CHECK(wait_until([&] { return sample(scrape(s.port), getppid) > at_failure + 1000; }, 30s));
    REQUIRE(notify.wait_for("READY=1", before));
    const auto& msgs = notify.messages();
    CHECK_THAT(msgs[before], Contains("RELOADING=1") && Contains("MONOTONIC_USEC="));
    // The error names file, line and key, at journal priority 3 (error).
    CHECK_THAT(d.log(), Contains("<3>reload failed, keeping the running configuration: " +
                                 s.config + ":13:5: tracers.page_faults.bogus_key: unknown key"));
  }

  SECTION("an alias bomb is refused at its first anchor; the running config goes on") {
    std::ofstream bomb(s.config, std::ios::app);
    bomb << "bomb0: &b0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int level = 1; level < 10; ++level) {
      bomb << "bomb" << level << ": &b" << level << " [*b" << level - 1;
      for (int i = 1; i < 10; ++i) bomb << ", *b" << level - 1;
      bomb << "]\n";
    }
    bomb.close();
    kill(d.pid(), SIGHUP);
    REQUIRE(wait_until(
        [&] {
          return sample(scrape(s.port), "ebpf_metricsd_config_last_reload_successful") == 0.0;
        },
        30s));
    CHECK_THAT(d.log(), Contains("reload failed, keeping the running configuration: " + s.config +
                                 ":13:8: bomb0: a YAML anchor (&name)"));
    const double at_failure = sample(scrape(s.port), getppid).value_or(0);
    CHECK(wait_until([&] { return sample(scrape(s.port), getppid) > at_failure + 1000; }, 30s));

    // A file of 100,000 nested lists (200 KB, under the size limit): refused, and the memory
    // its parse took returns.
    const long rss0 = rss_kib(d.pid());
    std::ofstream(s.config) << "web: " << std::string(100000, '[') << std::string(100000, ']')
                            << "\n";
    const auto failures = [&] {
      const std::string log = d.log();
      std::size_t n = 0;
      for (auto at = log.find("reload failed"); at != std::string::npos;
           at = log.find("reload failed", at + 1)) {
        ++n;
      }
      return n;
    };
    REQUIRE(failures() == 1);
    kill(d.pid(), SIGHUP);
    REQUIRE(wait_until([&] { return failures() == 2; }, 30s));
    CHECK_THAT(d.log(), Contains(s.config + ":1:37: web: nesting deeper than 32 levels"));
    // Under the sanitizers freed memory is quarantined, not returned: no bound then.
    long rss1 = 0;
    wait_until(
        [&] {
          rss1 = rss_kib(d.pid());
          return sanitized() || rss1 - rss0 < 5 * 1024;
        },
        30s);
    INFO("RSS " << rss0 << " KiB before the deep file, " << rss1 << " KiB after");
    if (!sanitized()) CHECK(rss1 - rss0 < 5 * 1024);
  }

  SECTION("a valid file attaches and detaches what changed; counters carry on") {
    const double before_reload = sample(scrape(s.port), getppid).value_or(0);
    const auto sched_progs_before = prog_ids_named(d.pid(), "sched_");
    std::ofstream(s.config) << "web:\n  listen_address: \"127.0.0.1:" << s.port
                            << "\"\ndrain_interval: 200ms\ntracers:\n"
                            << "  syscall_latency:\n    enabled: true\n"
                            << "    include: [getppid, getpid]\n    per_syscall: all\n"
                            << "  runqueue_latency:\n    enabled: true\n"
                            << "  offcpu_time:\n    enabled: true\n";
    const std::size_t before = notify.messages().size();
    kill(d.pid(), SIGHUP);
    REQUIRE(wait_until(
        [&] {
          return sample(scrape(s.port),
                        "ebpf_metricsd_tracer_up{tracer=\"offcpu_time\",hook=\"tp_btf\"}") == 1.0;
        },
        30s));
    REQUIRE(notify.wait_for("READY=1", before));
    CHECK_THAT(notify.messages()[before], Contains("RELOADING=1"));
    const std::string m = scrape(s.port);
    CHECK(sample(m, "ebpf_metricsd_config_last_reload_successful") == 1.0);
    // page_faults is gone with all its series; the others are up.
    CHECK_THAT(m, !Contains("ebpf_page_faults_total"));
    CHECK_THAT(m, !Contains("tracer=\"page_faults\""));
    CHECK(sample(m, "ebpf_metricsd_tracer_up{tracer=\"runqueue_latency\",hook=\"tp_btf\"}") == 1);
    CHECK(sample(m, "ebpf_metricsd_tracer_up{tracer=\"syscall_latency\",hook=\"tp_btf\"}") == 1);
    // syscall_latency was restarted with its new include list and counts on from where it was.
    REQUIRE(
        wait_until([&] { return sample(scrape(s.port), getppid) > before_reload + 1000; }, 30s));
    const std::string log = d.log();
    CHECK_THAT(log, Contains("<6>tracer syscall_latency options changed: restarting"));
    CHECK_THAT(log, Contains("<6>tracer page_faults disabled: detaching"));
    // offcpu_time starts with an object of its own (one sched_switch program more);
    // runqueue_latency's programs are untouched; the page fault programs are gone.
    CHECK_THAT(log, !Contains("tracer runqueue_latency options changed"));
    const auto sched_progs_after = prog_ids_named(d.pid(), "sched_");
    CHECK(sched_progs_after.size() == sched_progs_before.size() + 1);
    for (int id : sched_progs_before) CHECK(sched_progs_after.count(id) == 1);
    CHECK(prog_ids_named(d.pid(), "minor_fault").empty());
    CHECK(prog_ids_named(d.pid(), "major_fault").empty());
  }

  SECTION(
      "offcpu_time's new label_map_entries restarts it alone on a new object; its series count "
      "on, and runqueue_latency runs on undisturbed") {
    const auto reload_with = [&](const std::string& offcpu_options) {
      std::ofstream(s.config) << "web:\n  listen_address: \"127.0.0.1:" << s.port
                              << "\"\ndrain_interval: 200ms\ntracers:\n"
                              << "  syscall_latency:\n    enabled: true\n"
                              << "    include: [getppid]\n    per_syscall: all\n"
                              << "  runqueue_latency:\n    enabled: true\n"
                              << "  offcpu_time:\n    enabled: true\n"
                              << offcpu_options;
      const std::size_t before = notify.messages().size();
      kill(d.pid(), SIGHUP);
      REQUIRE(notify.wait_for("READY=1", before));
      REQUIRE(sample(scrape(s.port), "ebpf_metricsd_config_last_reload_successful") == 1.0);
    };
    // The daemon's labelled off-CPU map: its max_entries.
    const auto offcpu_map_entries = [&] {
      for (int id : bpf_ids(d.pid(), "map_id")) {
        const std::string info = run_capture("bpftool map show id " + std::to_string(id));
        std::smatch match;
        if (info.find(" name offcpu_hist_lab") != std::string::npos &&
            std::regex_search(info, match, std::regex("max_entries (\\d+)"))) {
          return std::stol(match[1]);
        }
      }
      return 0L;
    };
    const std::string runq_total = "ebpf_runqueue_latency_seconds_count";
    const std::string voluntary = "ebpf_context_switches_total{kind=\"voluntary\"}";
    reload_with("    comm: true\n");
    CHECK(offcpu_map_entries() == 4096);
    // Each object has its own sched_switch program, and only runqueue_latency's the wakeups.
    const auto progs_before = prog_ids_named(d.pid(), "sched_");
    CHECK(progs_before.size() == 4);
    std::string m = scrape(s.port);
    const double runq0 = sample(m, runq_total).value_or(0);
    const double voluntary0 = sample(m, voluntary).value_or(0);
    REQUIRE(runq0 > 0);

    reload_with("    comm: true\n    label_map_entries: 64\n");
    CHECK(offcpu_map_entries() == 64);
    const auto progs_after = prog_ids_named(d.pid(), "sched_");
    CHECK(progs_after.size() == progs_before.size());
    // offcpu_time's sched_switch program is new, runqueue_latency's three are the same.
    std::size_t kept = 0;
    for (int id : progs_after) kept += progs_before.count(id);
    CHECK(kept == 3);
    const std::string log = d.log();
    CHECK_THAT(log, Contains("tracer offcpu_time options changed: restarting"));
    CHECK_THAT(log, !Contains("tracer runqueue_latency options changed"));
    // The run-queue total went on, and the context switches went on from where they were.
    m = scrape(s.port);
    CHECK(sample(m, runq_total).value_or(0) >= runq0);
    CHECK(sample(m, voluntary).value_or(0) >= voluntary0);
    // ... counted from the new maps, with no jump from a baseline of the old ones.
    CHECK(sample(m, runq_total).value_or(0) < runq0 + 1e7);
    CHECK(sample(m, voluntary).value_or(0) < voluntary0 + 1e7);
    CHECK(wait_until([&] { return sample(scrape(s.port), runq_total).value_or(0) > runq0 + 100; },
                     30s));
    CHECK(sample(scrape(s.port),
                 "ebpf_metricsd_tracer_up{tracer=\"runqueue_latency\",hook=\"tp_btf\"}") == 1);
  }

  stop = true;
  scraper.join();
  INFO("getppid counts scraped: " << seen);
  CHECK(scrapes >= 3);
  CHECK(decreases == 0);
  const std::size_t before_stop = notify.messages().size();
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
  CHECK(notify.wait_for("STOPPING=1", before_stop));
  CHECK(notify.wait_for("WATCHDOG=1"));
}

TEST_CASE("every tracer is up as an unprivileged user with only CAP_BPF and CAP_PERFMON") {
  Setup s(all_tracers_enabled());
  chmod(s.dir.c_str(), 0755);
  chmod(s.config.c_str(), 0644);
  // The capabilities of systemd/ebpf-metricsd.service, nothing more.
  const std::string unit = read_file(SOURCE_DIR "/systemd/ebpf-metricsd.service");
  REQUIRE_THAT(unit, Contains("\nAmbientCapabilities=CAP_BPF CAP_PERFMON\n"));
  REQUIRE_THAT(unit, Contains("\nCapabilityBoundingSet=CAP_BPF CAP_PERFMON\n"));
  DaemonProcess d(daemon_path(), s.log,
                  {{"--config", s.config, "--strict"},
                   false,
                   {},
                   {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    "--inh-caps=-all,+bpf,+perfmon", "--ambient-caps=-all,+bpf,+perfmon",
                    "--bounding-set=-all,+bpf,+perfmon", "--no-new-privs", "--"}});
  REQUIRE(wait_until(
      [&] {
        return count_lines_starting(scrape(s.port), "ebpf_metricsd_tracer_up{") ==
               ebpf_metricsd::tracer_registry().size();
      },
      20s));
  const std::string m = scrape(s.port);
  INFO(m.substr(0, 3000) << d.log());
  CHECK(count_lines_starting(m, "ebpf_metricsd_tracer_up{") ==
        ebpf_metricsd::tracer_registry().size());
  CHECK_THAT(m, !Contains("hook=\"none\"} 0"));
  // It really runs as nobody with just those two capabilities.
  const std::string status = read_file("/proc/" + std::to_string(d.pid()) + "/status");
  CHECK_THAT(status, Contains("Uid:\t65534\t65534\t65534\t65534"));
  CHECK_THAT(status, Contains("CapEff:\t000000c000000000"));  // bits 38 (PERFMON), 39 (BPF)
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE("every tracer is up under the unit's system call filter; reload and stop work") {
  const auto allowed =
      unit_syscall_allow_list(read_file(SOURCE_DIR "/systemd/ebpf-metricsd.service"));
  INFO(allowed.size() << " system calls allowed");
  REQUIRE(allowed.size() > 100);
  REQUIRE(std::count(allowed.begin(), allowed.end(), "bpf") == 1);
  REQUIRE(std::count(allowed.begin(), allowed.end(), "mount") == 0);
  Setup s(all_tracers_enabled());
  DaemonProcess d(daemon_path(), s.log,
                  {{"--config", s.config, "--strict"}, false, {}, {}, allowed});
  REQUIRE(wait_until(
      [&] {
        return count_lines_starting(scrape(s.port), "ebpf_metricsd_tracer_up{") ==
               ebpf_metricsd::tracer_registry().size();
      },
      20s));
  const std::string m = scrape(s.port);
  INFO(d.log());
  CHECK_THAT(m, !Contains("hook=\"none\"} 0"));
  CHECK_THAT(read_file("/proc/" + std::to_string(d.pid()) + "/status"),
             Contains("Seccomp:\t2"));  // the filter is in force
  kill(d.pid(), SIGHUP);
  CHECK(wait_until([&] { return d.log().find("reload done") != std::string::npos; }, 30s));
  CHECK(sample(scrape(s.port), "ebpf_metricsd_config_last_reload_successful") == 1.0);
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
  CHECK_THAT(d.log(), !Contains("Operation not permitted"));
}

TEST_CASE("the systemd unit verifies and scores at most 3.0 in systemd-analyze security") {
  if (run_command("command -v systemd-analyze >/dev/null") != 0) {
    FAIL("systemd-analyze is not installed (packaging/install-deps.sh --with-tests)");
  }
  const std::string dir = temp_dir();
  // verify needs the ExecStart binaries to exist: point them at the built one.
  std::string unit = read_file(SOURCE_DIR "/systemd/ebpf-metricsd.service");
  unit = std::regex_replace(unit, std::regex("/usr/bin/ebpf-metricsd"), daemon_path());
  std::ofstream(dir + "/ebpf-metricsd.service") << unit;
  const std::string verify =
      run_capture("systemd-analyze verify " + dir + "/ebpf-metricsd.service 2>&1");
  CHECK(verify.empty());
  const std::string sec = run_capture("systemd-analyze security --offline=true " + dir +
                                      "/ebpf-metricsd.service 2>&1 | tail -1");
  std::smatch match;
  REQUIRE(std::regex_search(sec, match, std::regex("exposure level for \\S+: ([0-9.]+)")));
  const double score = std::stod(match[1]);
  INFO("systemd-analyze security: " << score);
  CHECK(score <= 3.0);
  run_command("rm -rf " + dir);
}

TEST_CASE("Ten thousand short-lived processes leave memory, series and maps bounded") {
  if (run_command("command -v stress-ng >/dev/null") != 0) {
    FAIL("stress-ng is not installed (packaging/install-deps.sh --with-tests)");
  }
  Setup s(
      "  syscall_latency:\n    enabled: true\n"
      "  runqueue_latency:\n    enabled: true\n    comm: true\n"
      "  offcpu_time:\n    enabled: true\n    comm: true\n"
      "  page_faults:\n    enabled: true\n"
      "  tcp_connect_latency:\n    enabled: true\n");
  // A low series limit, so that distinct command names overrun it.
  s.prepend("max_series: 300\n");
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  REQUIRE(wait_until(
      [&] { return count_lines_starting(scrape(s.port), "ebpf_metricsd_tracer_up{") == 5; }, 30s));
  std::this_thread::sleep_for(1s);
  const long rss0 = rss_kib(d.pid());

  // Churn: stress-ng forks, and processes of 2,000 distinct names (some cut mid-character
  // by the kernel's 16-byte comm).
  REQUIRE(run_command("stress-ng --fork 2 --fork-ops 10000 --quiet >/dev/null 2>&1") == 0);
  for (int i = 0; i < 2000; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      // Eight two-byte characters: the kernel keeps 15 bytes, the last one half of "é".
      const std::string name = i % 2 ? "emd-" + std::to_string(i) : "éééééééé";
      prctl(PR_SET_NAME, name.c_str());
      usleep(1000);  // sleep: an off-CPU period and a wakeup under this name
      _exit(0);
    }
    waitpid(pid, nullptr, 0);
  }
  // Drains after the churn: until what it must have caused shows (series over the limit
  // counted, the half character replaced), however long a drain takes on this machine.
  std::string m;
  wait_until(
      [&] {
        m = scrape(s.port);
        return sample(m,
                      "ebpf_metricsd_series_limited_total{metric=\"ebpf_runqueue_latency_"
                      "seconds\"}")
                       .value_or(0) > 0 &&
               m.find("\xEF\xBF\xBD") != std::string::npos;
      },
      30s);
  const long rss1 = rss_kib(d.pid());
  INFO("RSS " << rss0 << " KiB before, " << rss1 << " KiB after");

  // Series per metric stay under max_series; what did not fit is counted.
  const std::size_t runq_series = count_lines_starting(m, "ebpf_runqueue_latency_seconds_count{");
  const std::size_t offcpu_series = count_lines_starting(m, "ebpf_offcpu_seconds_count{");
  INFO("runqueue series " << runq_series << ", offcpu series " << offcpu_series);
  CHECK(runq_series <= 300);
  CHECK(offcpu_series <= 300);
  CHECK(sample(m, "ebpf_metricsd_series_limited_total{metric=\"ebpf_runqueue_latency_seconds\"}")
            .value_or(0) > 0);
  CHECK(rss1 - rss0 < 64 * 1024);
  // Label values stay valid UTF-8: the half character became U+FFFD.
  CHECK_THAT(m, Contains("\xEF\xBF\xBD"));
  {
    const std::string file = s.dir + "/scrape.txt";
    std::ofstream(file) << m;
    CHECK(run_command("promtool check metrics < " + file + " >/dev/null 2>&1") == 0);
  }

  // No BPF map of the daemon holds more than it was sized for, and the per-task state was
  // freed with the tasks (task storage); the in-flight connect map is empty again.
  const auto maps = bpf_ids(d.pid(), "map_id");
  REQUIRE_FALSE(maps.empty());
  for (int id : maps) {
    const std::string info = run_capture("bpftool map show id " + std::to_string(id));
    std::smatch match;
    if (!std::regex_search(info, match, std::regex("max_entries (\\d+)"))) continue;
    const long max_entries = std::stol(match[1]);
    if (info.find(": hash") == std::string::npos &&
        info.find(": percpu_hash") == std::string::npos) {
      continue;  // arrays are fixed; task storage lives and dies with its task
    }
    const std::string dump = run_capture("bpftool map dump id " + std::to_string(id) +
                                         " 2>/dev/null | grep -c '^key\\|\"key\"'");
    const long entries = dump.empty() ? 0 : std::stol(dump);
    INFO(info << "entries " << entries);
    CHECK(entries <= max_entries);
    // Requests and connects in flight, stamped at start: they end, and leave the map.
    if (info.find("spilled") != std::string::npos || info.find("issued") != std::string::npos) {
      CHECK(entries < 100);
    }
  }
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE("Four thousand short-lived cgroups leave maps, series and memory bounded") {
  // Every tracer that labels by cgroup. 4,000 cgroups pass through, each with a process
  // that makes a few syscalls and page faults; one in 10 stays until the end. The label
  // maps hold a quarter of what the passing cgroups would need without retiring the entries
  // of removed ones (1,000 sets against ~4,000; syscall_latency 8,192 against ~10 syscalls
  // each), so a single map_full drop means retirement failed.
  // Every registry tracer whose events have a task owner but the profile (which labels
  // stacks, not series of a label map), each with its map of label sets.
  const std::map<std::string, std::string> map_entries = {{"syscall_latency", "8192"}};
  std::string tracers;
  std::vector<std::string> labelled;
  for (const auto& desc : ebpf_metricsd::tracer_registry()) {
    if (desc.traits.owner != ebpf_metricsd::EventOwner::Task || desc.name == "profile") continue;
    const auto it = map_entries.find(desc.name);
    const std::string entries = it == map_entries.end() ? "1000" : it->second;
    tracers += "  " + desc.name + ":\n    enabled: true\n    cgroup: true\n" +
               "    label_map_entries: " + entries + "\n";
    labelled.push_back(desc.name);
  }
  REQUIRE(labelled.size() >= 8);
  Setup s(tracers);
  s.prepend("max_series: 300\n");  // fewer than the cgroups that stay
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  REQUIRE(wait_until(
      [&] {
        return count_lines_starting(scrape(s.port), "ebpf_metricsd_tracer_up{") == labelled.size();
      },
      20s));
  std::this_thread::sleep_for(1s);
  const long rss0 = rss_kib(d.pid());

  constexpr int kCgroups = 4000, kKeepEvery = 10;
  std::vector<std::unique_ptr<TestCgroup>> kept;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCgroups; ++i) {
    auto cg = std::make_unique<TestCgroup>(i % kKeepEvery ? "churn" : "keep" + std::to_string(i));
    cg->run([] {
      ebpf_metricsd::workload::getppid_calls(10);
      ebpf_metricsd::workload::touch_anon_pages(4);
    });
    if (i % kKeepEvery == 0) kept.push_back(std::move(cg));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Drains after the churn: until what it must have caused shows (series over the limit
  // counted, events of removed cgroups as "unknown"), however long a drain takes here.
  std::string m;
  wait_until(
      [&] {
        m = scrape(s.port);
        return sample(m, "ebpf_metricsd_series_limited_total{metric=\"ebpf_page_faults_total\"}")
                       .value_or(0) > 0 &&
               m.find("ebpf_page_faults_total{type=\"minor\",cgroup=\"unknown\"") !=
                   std::string::npos;
      },
      30s);
  const long rss1 = rss_kib(d.pid());
  INFO(kCgroups << " cgroups in " << seconds << " s; RSS " << rss0 << " KiB before, " << rss1
                << " KiB after");

  WARN(kCgroups << " cgroups in " << seconds << " s; daemon RSS " << rss0 << " KiB before, " << rss1
                << " KiB after");
  // Not one event lost for want of room: idle entries of removed cgroups were retired.
  for (const std::string& t : labelled) {
    INFO(t);
    CHECK(sample(m, "ebpf_metricsd_dropped_events_total{tracer=\"" + t + "\",reason=\"map_full\"}")
              .value_or(-1) == 0);
  }
  // Series stay within max_series; what did not fit is counted. Cgroups removed before
  // their events were drained count as "unknown".
  const std::size_t series = count_lines_starting(m, "ebpf_page_faults_total{");
  INFO("page fault series " << series);
  CHECK(series <= 300);
  CHECK(sample(m, "ebpf_metricsd_series_limited_total{metric=\"ebpf_page_faults_total\"}")
            .value_or(0) > 0);
  CHECK_THAT(m, Contains("ebpf_page_faults_total{type=\"minor\",cgroup=\"unknown\""));
  CHECK(rss1 - rss0 < 64 * 1024);

  // Every labelled map has room left, though far more cgroups passed through it.
  for (int id : bpf_ids(d.pid(), "map_id")) {
    const std::string info = run_capture("bpftool map show id " + std::to_string(id));
    // Map names are cut at 15 characters: "hists_by_cgroup", "series_by_cgrou", ...
    if (info.find("_by_cg") == std::string::npos && info.find("_hist_lab") == std::string::npos)
      continue;
    std::smatch match;
    REQUIRE(std::regex_search(info, match, std::regex("max_entries (\\d+)")));
    const long max_entries = std::stol(match[1]);
    const std::string dump = run_capture("bpftool map dump id " + std::to_string(id) +
                                         " 2>/dev/null | grep -c '^key\\|\"key\"'");
    const long entries = dump.empty() ? 0 : std::stol(dump);
    INFO(info << "entries " << entries);
    WARN("label map: " << info.substr(0, info.find('\n')) << " entries " << entries);
    // Without retirement every map the workload reaches would be full.
    CHECK(entries < max_entries);
  }
  kept.clear();
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE("reload: web settings change the server; one that cannot start keeps the old") {
  Setup s("  page_faults:\n    enabled: true\n");
  const std::string web = s.dir + "/web.yml";
  std::ofstream(web) << "# no TLS, no users yet\n";
  auto args = s.args();
  args.push_back("--web.config.file=" + web);
  DaemonProcess d(daemon_path(), s.log, {args, false, {}, {}});
  REQUIRE(wait_until([&] { return http_get(s.port, "/metrics").status == 200; }, 30s));
  auto reload_ok = [&](int port, const std::string& auth) {
    return sample(http_get(port, "/metrics", auth).body,
                  "ebpf_metricsd_config_last_reload_successful");
  };

  // Basic auth switched on by a reload.
  const std::string hash = ebpf_metricsd::bcrypt_hash("pw", 5);
  REQUIRE_FALSE(hash.empty());
  std::ofstream(web) << "basic_auth_users:\n  scraper: " << hash << "\n";
  kill(d.pid(), SIGHUP);
  const std::string auth = "Authorization: Basic c2NyYXBlcjpwdw==\r\n";  // scraper:pw
  REQUIRE(wait_until([&] { return http_get(s.port, "/metrics").status == 401; }, 30s));
  CHECK(http_get(s.port, "/metrics", auth).status == 200);
  CHECK(reload_ok(s.port, auth) == 1.0);

  // A new listen address moves the server.
  const int moved = free_port();
  {
    std::string cfg = read_file(s.config);
    cfg.replace(cfg.find(std::to_string(s.port)), std::to_string(s.port).size(),
                std::to_string(moved));
    std::ofstream(s.config) << cfg;
  }
  kill(d.pid(), SIGHUP);
  REQUIRE(wait_until([&] { return http_get(moved, "/metrics", auth).status == 200; }, 30s));
  CHECK(http_get(s.port, "/metrics", auth).status == 0);  // nothing listens there now

  // An address that is taken: the reload fails and the server stays where it was.
  const int taken_fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(taken_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(taken_fd, 1) == 0);
  socklen_t len = sizeof a;
  getsockname(taken_fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int taken = ntohs(a.sin_port);
  {
    std::string cfg = read_file(s.config);
    cfg.replace(cfg.find(std::to_string(moved)), std::to_string(moved).size(),
                std::to_string(taken));
    std::ofstream(s.config) << cfg;
  }
  kill(d.pid(), SIGHUP);
  REQUIRE(wait_until([&] { return reload_ok(moved, auth) == 0.0; }, 30s));
  CHECK(http_get(moved, "/metrics", auth).status == 200);
  CHECK_THAT(d.log(), Contains("keeping the previous web settings"));
  close(taken_fd);
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
}

TEST_CASE(
    "fatal signals end in a restart under the unit's rules; SIGPIPE and early SIGHUPs do not") {
  // The unit's rules: restart after every exit of the main process (systemd counts SIGTERM,
  // SIGINT, SIGHUP and SIGPIPE deaths as clean, so on-failure would leave those down) except
  // an invalid config at start.
  const std::string unit = read_file(SOURCE_DIR "/systemd/ebpf-metricsd.service");
  REQUIRE_THAT(unit, Contains("\nRestart=always\n") &&
                         Contains("\nRestartPreventExitStatus=" +
                                  std::to_string(ebpf_metricsd::kExitConfigError) + "\n"));
  CHECK(unit.find("ExecStartPre=") == std::string::npos);  // its failure would loop
  const auto systemd_restarts = [](int status) {
    return status != ebpf_metricsd::kExitConfigError;
  };

  // The daemons killed below must not leave core files wherever the tests run.
  const rlimit no_core{0, 0};
  REQUIRE(setrlimit(RLIMIT_CORE, &no_core) == 0);
  Setup s;
  for (const int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGQUIT, SIGKILL, SIGUSR1,
                        SIGUSR2, SIGALRM, SIGTERM, SIGINT}) {
    INFO("signal " << strsignal(sig));
    DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
    REQUIRE(wait_until([&] { return http_get(s.port, "/-/healthy").status == 200; }, 20s));
    kill(d.pid(), sig);
    const int status = d.wait_exit(10s);
    REQUIRE(status >= 0);
    // Stopped by its handler (SIGTERM, SIGINT: exit 0) or killed: restarted either way.
    CHECK((sig == SIGTERM || sig == SIGINT ? status == 0 : status == 128 + sig));
    CHECK(systemd_restarts(status));
  }

  // SIGHUPs from the first instant of main() on (its first step blocks them, before any
  // thread, config or tracer exists) and SIGPIPE: the daemon lives and serves. (Before main()
  // the dynamic loader runs, and a signal then takes its default action in any program: tens
  // of milliseconds on a slow machine, which nothing the daemon does can shorten.)
  DaemonProcess d(daemon_path(), s.log, {s.args(), false, {}, {}});
  const std::string proc_status = "/proc/" + std::to_string(d.pid()) + "/status";
  REQUIRE(wait_until(
      [&] {
        std::error_code ec;
        if (std::filesystem::read_symlink("/proc/" + std::to_string(d.pid()) + "/exe", ec) !=
            std::filesystem::canonical(daemon_path()))
          return false;
        // SigBlk: the main thread's blocked signals, a hexadecimal mask (SIGHUP: bit 0).
        std::ifstream in(proc_status);
        for (std::string line; std::getline(in, line);) {
          if (line.rfind("SigBlk:", 0) == 0)
            return (std::stoull(line.substr(7), nullptr, 16) & (1ull << (SIGHUP - 1))) != 0;
        }
        return false;
      },
      30s));
  for (int i = 0; i < 50; ++i) {
    kill(d.pid(), SIGHUP);
    std::this_thread::sleep_for(1ms);
  }
  kill(d.pid(), SIGPIPE);
  INFO("daemon log:\n" << d.log());
  REQUIRE(wait_until([&] { return http_get(s.port, "/-/healthy").status == 200; }, 20s));
  CHECK(d.wait_exit(500ms) == -1);
  CHECK(http_get(s.port, "/metrics").status == 200);
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(10s) == 0);

  // An invalid config at start: exit 78, which the unit does not restart.
  Setup bad("  syscall_latency:\n    enabled: true\n    colour: blue\n");
  DaemonProcess b(daemon_path(), bad.log, {bad.args(), false, {}, {}});
  const int status = b.wait_exit(10s);
  CHECK(status == ebpf_metricsd::kExitConfigError);
  CHECK_FALSE(systemd_restarts(status));
}
