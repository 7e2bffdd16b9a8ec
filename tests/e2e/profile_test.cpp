// Profiles through the daemon, as operators and their tools fetch them: pprof over HTTPS
// with basic auth that `go tool pprof` reads, its bounds, and the flame graph page in a real
// browser (headless Chromium).
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "../slow_reads.h"
#include "daemon_process.h"
#include "ebpf_metricsd/http/basic_auth.h"

using namespace ebpf_metricsd::test;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

extern char** environ;

namespace {

const char* const kUser = "pyroscope";
const char* const kPassword = "pr0file-Pa55";

// The known workload (tests/profile_workload), running until killed (1000 s of CPU).
struct Workload {
  pid_t pid = 0;
  Workload() {
    char* argv[] = {const_cast<char*>(PROFILE_WORKLOAD_FP), const_cast<char*>("1000000"),
                    const_cast<char*>("100000"), nullptr};
    REQUIRE(posix_spawn(&pid, PROFILE_WORKLOAD_FP, nullptr, nullptr, argv, environ) == 0);
  }
  ~Workload() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

// The daemon with the profile tracer, over HTTPS with basic auth.
struct ProfileDaemon {
  Setup s;
  std::unique_ptr<DaemonProcess> d;
  std::string base;

  // 997 Hz: enough samples in a few seconds for the shares the tests check. `more`: other
  // tracers' config.
  explicit ProfileDaemon(const std::string& more = "")
      : s("  profile:\n    enabled: true\n    frequency: 997\n    cgroup: true\n" + more) {
    REQUIRE(run_command("cd " + s.dir +
                        " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
                        " -days 2 -keyout server.key -out server.pem -subj /CN=127.0.0.1"
                        " -addext subjectAltName=IP:127.0.0.1 2>/dev/null") == 0);
    std::ofstream(s.dir + "/web.yml")
        << "tls_server_config:\n  cert_file: " << s.dir << "/server.pem\n  key_file: " << s.dir
        << "/server.key\nbasic_auth_users:\n  " << kUser << ": "
        << ebpf_metricsd::bcrypt_hash(kPassword, 10) << "\n";
    auto args = s.args();
    args.push_back("--web.config.file");
    args.push_back(s.dir + "/web.yml");
    d = std::make_unique<DaemonProcess>(daemon_path(), s.log,
                                        DaemonProcess::Options{args, false, {}, {}});
    base = "https://127.0.0.1:" + std::to_string(s.port);
    const bool up = wait_until(
        [&] {
          const auto m = get("/metrics");
          return m.first == "200" &&
                 std::regex_search(
                     m.second,
                     std::regex(
                         "\nebpf_metricsd_tracer_up\\{tracer=\"profile\",hook=\"[a-z_]+\"\\} 1\n"));
        },
        30s);
    INFO(d->log());
    REQUIRE(up);
  }
  // status and body of one GET; `auth` false sends no credentials.
  std::pair<std::string, std::string> get(const std::string& path, bool auth = true,
                                          const std::string& max_time = "60") const {
    const std::string out =
        s.dir + "/body." + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    const std::string code =
        run_capture("curl -sk -o " + out + " -w '%{http_code}' --max-time " + max_time +
                    (auth ? std::string(" -u ") + kUser + ":" + kPassword : std::string()) + " '" +
                    base + path + "'");
    return {code.empty() ? "000" : code, read_file(out)};
  }
  // The page at `path` as a browser is given it: the credentials in the URL.
  std::string page_url(const std::string& path) const {
    return "https://" + std::string(kUser) + ":" + kPassword +
           "@127.0.0.1:" + std::to_string(s.port) + path;
  }
  // Headless chromium with a profile directory in the test's own, up to the URL.
  std::string chromium() const {
    return "chromium --headless --no-sandbox --disable-gpu --ignore-certificate-errors "
           "--user-data-dir=" +
           s.dir + "/chromium --virtual-time-budget=15000 ";
  }
};

// A screenshot of the page at `url` by `chromium` (its command line so far), kept with the
// build as test-artifacts/`name` for a person to look at.
void keep_screenshot(const std::string& chromium, const std::string& url, const std::string& name) {
  const std::string shot = BINARY_DIR "/test-artifacts/" + name;
  run_command("mkdir -p " BINARY_DIR "/test-artifacts");
  run_command(chromium + "--window-size=1400,900 --screenshot=" + shot + " '" + url +
              "' >/dev/null 2>&1");
  std::ifstream png(shot, std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  CHECK(std::string(magic + 1, 3) == "PNG");
}

}  // namespace

TEST_CASE("pprof over HTTPS with basic auth: go tool pprof reads the known workload's profile",
          "[profile][sanitize]") {
  ProfileDaemon p;
  Workload w;
  const auto [status, body] = p.get("/debug/pprof/profile?seconds=3");
  INFO(p.d->log());
  REQUIRE(status == "200");
  REQUIRE(body.size() > 2);
  CHECK(static_cast<unsigned char>(body[0]) == 0x1f);  // a gzip stream, as Go serves it
  CHECK(static_cast<unsigned char>(body[1]) == 0x8b);
  const std::string file = p.s.dir + "/profile.pb.gz";
  std::ofstream(file) << body;
  // pprof as Go's own tool reads it; no symbolization (the daemon named every frame).
  const std::string raw =
      run_capture("HOME=" + p.s.dir + " go tool pprof -raw -symbolize=none " + file + " 2>&1");
  INFO(raw.substr(0, 4000));
  CHECK_THAT(raw, Contains("samples/count cpu/nanoseconds[dflt] off_cpu/nanoseconds"));
  CHECK_THAT(raw, Contains("hot_three"));
  CHECK_THAT(raw, Contains("hot_one"));
  CHECK_THAT(raw, Contains("wait_on_pipe"));
  CHECK_THAT(raw, Contains("pipe_read"));
  // The top of the on-CPU time, by pprof: the workload's hot function leads.
  const std::string top = run_capture("HOME=" + p.s.dir +
                                      " go tool pprof -top -sample_index=cpu -symbolize=none"
                                      " -tagfocus=comm=profile_workloa " +
                                      file + " 2>&1");
  INFO(top);
  const std::regex first_row(
      R"(\n\s*[0-9.]+m?s\s+[0-9.]+%\s+[0-9.]+%\s+[0-9.]+m?s\s+[0-9.]+%\s+(\S+))");
  std::smatch m;
  REQUIRE(std::regex_search(top, m, first_row));
  CHECK(m[1] == "hot_three");
}

TEST_CASE("profile requests: credentials, bad seconds, a bound on those waiting, scrapes go on",
          "[profile]") {
  ProfileDaemon p;
  CHECK(p.get("/debug/pprof/profile?seconds=1", false).first == "401");
  CHECK(p.get("/profile", false).first == "401");
  const auto bad = p.get("/debug/pprof/profile?seconds=0");
  CHECK(bad.first == "400");
  CHECK_THAT(bad.second, Contains("seconds must be at least 1"));
  CHECK(p.get("/debug/pprof/profile?seconds=abc").first == "400");
  CHECK(p.get("/debug/pprof/profile").first == "400");
  CHECK(p.get("/debug/pprof/profile?seconds=100000").first == "400");
  CHECK(p.get("/debug/pprof/profile?seconds=1&seconds=2").first == "400");
  std::string many = "/debug/pprof/profile?seconds=1";
  for (int i = 0; i < 64; ++i) many += "&seconds=1";
  const auto flood = p.get(many);
  CHECK(flood.first == "400");
  CHECK_THAT(flood.second, Contains("more than 64 query parameters"));
  CHECK(p.get("/metrics", true, "5").first == "200");

  // Five requests at once for an 8-second window: four wait for it, the fifth is refused at
  // once, and scrapes are served meanwhile.
  std::vector<std::thread> waiting;
  std::vector<std::pair<std::string, std::string>> answers(5);
  std::vector<double> took(5);
  for (int i = 0; i < 5; ++i) {
    waiting.emplace_back([&, i] {
      const auto t0 = std::chrono::steady_clock::now();
      answers[i] = p.get("/debug/pprof/profile?seconds=8");
      took[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  std::this_thread::sleep_for(2s);
  CHECK(p.get("/metrics", true, "5").first == "200");
  for (auto& t : waiting) t.join();
  int ok = 0, refused = 0;
  for (int i = 0; i < 5; ++i) {
    INFO("request " << i << ": " << answers[i].first << " after " << took[i] << " s");
    if (answers[i].first == "200") {
      ++ok;
      CHECK(took[i] >= 8.0);  // the window, waited for
    } else {
      ++refused;
      CHECK(answers[i].first == "503");
      CHECK_THAT(answers[i].second,
                 Contains("4 requests of /debug/pprof/profile are waiting already"));
      CHECK(took[i] < 8.0);  // at once, not after the window
    }
  }
  CHECK(ok == 4);
  CHECK(refused == 1);
  // And once they are answered, a new one is taken again.
  CHECK(p.get("/debug/pprof/profile?seconds=1").first == "200");
}

TEST_CASE("slow events on the flame graph page in a real browser: the function that made them",
          "[profile][browser][slow]") {
  ProfileDaemon p(
      "  syscall_latency:\n    enabled: true\n    include: [read]\n"
      "    slow: {threshold: 10ms, max_per_second: 1000}\n");
  {
    SlowReader reader(3, std::chrono::milliseconds(30));
    const bool seen = wait_until(
        [&] {
          const auto d = p.get("/profile/data?slow=1&seconds=600");
          return d.first == "200" &&
                 d.second.find("slow_read_in_known_function") != std::string::npos;
        },
        30s);
    REQUIRE(seen);
    CHECK(reader.finish() == 0);
  }
  const std::string url =
      p.page_url("/profile?slow=1&seconds=600&metric=ebpf_syscall_latency_seconds");
  const std::string chromium = p.chromium();
  const std::string dom = run_capture(chromium + "--dump-dom '" + url + "' 2>/dev/null");
  INFO(dom.substr(0, 3000));
  REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
  CHECK_THAT(dom, Contains("slow events (metric ebpf_syscall_latency_seconds)"));
  CHECK(std::regex_search(
      dom,
      std::regex(R"re(<div class="f[^"]*"[^>]*data-name="[^"]*slow_read_in_known_function)re")));
  keep_screenshot(chromium, url, "slow-events-flame-graph.png");
}

TEST_CASE("the flame graph page in a real browser: the known workload's functions, drawn to scale",
          "[profile][browser]") {
  ProfileDaemon p;
  {
    Workload w;
    // Fixed CPU work is done at any speed: wait for it through the daemon's own data.
    const bool seen = wait_until(
        [&] {
          const auto d = p.get("/profile/data?seconds=60");
          return d.first == "200" && d.second.find("hot_one") != std::string::npos &&
                 d.second.find("wait_on_pipe") != std::string::npos;
        },
        30s);
    REQUIRE(seen);
    std::this_thread::sleep_for(3s);  // a few hundred samples more at 97 Hz
  }
  const std::string url = p.page_url("/profile?seconds=60&group=process");
  const std::string chromium = p.chromium();
  const std::string dom = run_capture(chromium + "--dump-dom '" + url + "' 2>/dev/null");
  REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
  // Every bar of a function: its name and its width in percent of the page's root.
  const std::regex bar(R"re(<div class="f[^"]*"[^>]*>)re");
  const std::regex name_of(R"re(data-name="([^"]*)")re"), width_of(R"re(width: ([0-9.]+)%)re");
  double three = 0, one = 0, wait = 0;
  int bars = 0;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), bar); it != std::sregex_iterator();
       ++it) {
    const std::string tag = it->str();
    std::smatch name, width;
    if (!std::regex_search(tag, name, name_of) || !std::regex_search(tag, width, width_of))
      continue;
    ++bars;
    if (name[1] == "hot_three") three += std::stod(width[1]);
    if (name[1] == "hot_one") one += std::stod(width[1]);
    if (name[1] == "wait_on_pipe") wait += std::stod(width[1]);
  }
  INFO(bars << " bars");
  INFO("widths: hot_three " << three << "%, hot_one " << one << "%, wait_on_pipe " << wait << "%");
  REQUIRE(three + one > 0);
  const double share = three / (three + one);
  CHECK(share > 0.70);
  CHECK(share < 0.80);
  CHECK(wait > 0);
  keep_screenshot(chromium, url, "profile-flame-graph.png");
}

namespace {

// The capabilities an AmbientCapabilities= line of a unit file names, as setpriv spells
// them ("+sys_ptrace").
std::vector<std::string> ambient_capabilities(const std::string& unit) {
  std::vector<std::string> caps;
  std::smatch line;
  for (auto it = unit.cbegin();
       std::regex_search(it, unit.cend(), line, std::regex("\nAmbientCapabilities=([^\n]*)"));
       it = line[0].second) {
    std::istringstream names(line[1].str());
    for (std::string name; names >> name;) {
      REQUIRE(name.rfind("CAP_", 0) == 0);
      std::string lower = name.substr(4);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      caps.push_back("+" + lower);
    }
  }
  return caps;
}

// A 3-second profile of the known workload (run as root) from the daemon run as nobody with
// the ambient capabilities of `units`, as `go tool pprof -raw` prints it.
std::string profile_as_nobody(const std::vector<std::string>& units) {
  std::string caps = "-all";
  for (const std::string& unit : units) {
    for (const std::string& c : ambient_capabilities(read_file(unit))) caps += "," + c;
  }
  INFO("capabilities " << caps);
  Setup s("  profile:\n    enabled: true\n    frequency: 997\n");
  chmod(s.dir.c_str(), 0755);
  chmod(s.config.c_str(), 0644);
  DaemonProcess d(daemon_path(), s.log,
                  {s.args(),
                   false,
                   {},
                   {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    "--inh-caps=" + caps, "--ambient-caps=" + caps, "--bounding-set=" + caps,
                    "--no-new-privs", "--"}});
  const std::regex up("\nebpf_metricsd_tracer_up\\{tracer=\"profile\",hook=\"[a-z_]+\"\\} 1\n");
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port);
  const bool is_up = wait_until(
      [&] { return std::regex_search(run_capture("curl -s " + url + "/metrics"), up); }, 30s);
  INFO(d.log());
  REQUIRE(is_up);
  Workload w;
  const std::string file = s.dir + "/profile.pb.gz";
  REQUIRE(run_capture("curl -s -o " + file + " -w '%{http_code}' '" + url +
                      "/debug/pprof/profile?seconds=3'") == "200");
  kill(d.pid(), SIGTERM);
  CHECK(d.wait_exit(5s) == 0);
  return run_capture("HOME=" + s.dir + " go tool pprof -raw -symbolize=none " + file + " 2>&1");
}

}  // namespace

TEST_CASE(
    "under the systemd unit's capabilities, the profile's drop-in is what names another "
    "user's functions and the kernel's",
    "[profile]") {
  const std::string unit = SOURCE_DIR "/systemd/ebpf-metricsd.service";
  const std::string dropin = SOURCE_DIR "/systemd/profile.conf";
  REQUIRE(ambient_capabilities(read_file(unit)) == std::vector<std::string>{"+bpf", "+perfmon"});
  SECTION("the unit with the drop-in") {
    const std::string raw = profile_as_nobody({unit, dropin});
    INFO(raw.substr(0, 4000));
    CHECK_THAT(raw, Contains("hot_three"));
    CHECK_THAT(raw, Contains("wait_on_pipe"));
    CHECK_THAT(raw, Contains("pipe_read"));
    CHECK_THAT(raw, Contains("schedule"));
  }
  SECTION("the unit alone: the tracer runs, but it can name neither") {
    const std::string raw = profile_as_nobody({unit});
    INFO(raw.substr(0, 4000));
    CHECK_THAT(raw, Contains("samples/count cpu/nanoseconds[dflt] off_cpu/nanoseconds"));
    CHECK_THAT(raw, !Contains("hot_three"));
    CHECK_THAT(raw, !Contains("pipe_read"));
  }
}
