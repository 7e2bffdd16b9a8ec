// Profiles through the daemon, as operators and their tools fetch them: pprof over HTTPS
// with basic auth that `go tool pprof` reads, its bounds, and the flame graph page in a real
// browser (headless Chromium).
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../slow_reads.h"
#include "daemon_process.h"
#include "ebpf_metricsd/http/basic_auth.h"
#include "ebpf_metricsd/profile/profile_routes.h"

using namespace ebpf_metricsd::test;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using namespace std::chrono_literals;

extern char** environ;

namespace {

const char* const kUser = "pyroscope";
const char* const kPassword = "pr0file-Pa55";

// The known workload (tests/profile_workload), running until killed (1000 s of CPU).
struct Workload {
  pid_t pid = 0;
  explicit Workload(const char* binary = PROFILE_WORKLOAD_FP) {
    char* argv[] = {const_cast<char*>(binary), const_cast<char*>("1000000"),
                    const_cast<char*>("100000"), nullptr};
    REQUIRE(posix_spawn(&pid, binary, nullptr, nullptr, argv, environ) == 0);
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

// Whether, within `limit`, the daemon's own data shows the known workload's CPU work under
// its callers (run_rounds: walked with the workload's own table) and its reader's waits
// (wait_on_pipe, reached only through the C library's read).
bool workload_walked(ProfileDaemon& p, std::chrono::seconds limit) {
  return wait_until(
      [&] {
        const auto d = p.get("/profile/data?seconds=60&view=wall");
        return d.first == "200" && d.second.find("hot_one") != std::string::npos &&
               d.second.find("run_rounds") != std::string::npos &&
               d.second.find("wait_on_pipe") != std::string::npos;
      },
      limit);
}

// Now as a Unix time in milliseconds (a page's from= and to=).
std::uint64_t unix_ms_now() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

// The known workload under the daemon: its pid, and the range (from=...&to=...) of its
// profile after the daemon had loaded its tables.
struct WalkedWorkload {
  pid_t pid;
  std::string range;
};

// Runs the known workload (`binary`) under the daemon until the daemon's own data shows its
// CPU work and its reader's waits (fixed work, done at any speed), then 4 s more (thousands of
// samples at 997 Hz): that range holds the walks made with every table loaded, none of the
// workload's first samples, taken before the daemon had read it.
WalkedWorkload profile_workload(ProfileDaemon& p, const char* binary) {
  Workload w(binary);
  REQUIRE(workload_walked(p, 30s));
  const std::uint64_t from = unix_ms_now();
  std::this_thread::sleep_for(4s);
  return {w.pid, "from=" + std::to_string(from) + "&to=" + std::to_string(unix_ms_now())};
}

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
  // Once the daemon has walked it through the C library (the process read, the tables of its
  // files loaded: seconds on a slow machine, or under the sanitizers), 3 s of its profile.
  REQUIRE(workload_walked(p, 60s));
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
  CHECK(m[1] == "hot_three");  // its loop is inlined: without lines, hot_three's own
}

TEST_CASE(
    "source lines: go tool pprof -lines names the workload's hot line, an inlined "
    "function is a frame of its own",
    "[profile][lines]") {
  // The workload is built with -g: its hottest line is marked in its source, inside
  // spin_three(), which is inlined into hot_three().
  int hot_line = 0;
  {
    std::ifstream src(PROFILE_WORKLOAD_SOURCE);
    std::string line;
    for (int n = 1; std::getline(src, line); ++n) {
      if (line.find("/* the hot line */") != std::string::npos) hot_line = n;
    }
  }
  REQUIRE(hot_line > 0);
  ProfileDaemon p("    lines: true\n");
  Workload w;
  const auto [status, body] = p.get("/debug/pprof/profile?seconds=3");
  INFO(p.d->log());
  REQUIRE(status == "200");
  const std::string file = p.s.dir + "/lines.pb.gz";
  std::ofstream(file) << body;
  const std::string pprof = "HOME=" + p.s.dir +
                            " go tool pprof -sample_index=cpu -symbolize=none"
                            " -tagfocus=comm=profile_workloa ";
  // The first row of -top -lines: the hottest line, in the inlined function.
  const std::string top = run_capture(pprof + "-top -lines " + file + " 2>&1");
  INFO(top);
  const std::regex first_row(
      R"(\n\s*[0-9.]+m?s\s+[0-9.]+%\s+[0-9.]+%\s+[0-9.]+m?s\s+[0-9.]+%\s+(\S+) (\S+):([0-9]+)( \(inline\))?)");
  std::smatch m;
  REQUIRE(std::regex_search(top, m, first_row));
  CHECK(m[1] == "spin_three");
  CHECK_THAT(m[2].str(), EndsWith("profile_workload.c"));
  CHECK(m[3] == std::to_string(hot_line));
  CHECK(m[4] == " (inline)");
  // By function, spin_three is a frame of its own, inlined in hot_three, its only caller.
  const std::string peek = run_capture(pprof + "-peek '^spin_three$' " + file + " 2>&1");
  INFO(peek);
  CHECK(
      std::regex_search(peek, std::regex(R"(\|\s+hot_three \(inline\)\n[^\n]*\|\s+spin_three\n)")));
  // -list shows the source with the time on that line (pprof trims the build's directory
  // from the file's name as it sees fit: the source is looked for below tests/ too).
  const std::string list = run_capture(pprof +
                                       "-source_path=" SOURCE_DIR
                                       "/tests -list "
                                       "'^spin_three$' " +
                                       file + " 2>&1");
  INFO(list);
  CHECK(std::regex_search(
      list, std::regex("\n\\s+[0-9.]+m?s\\s+[0-9.]+m?s\\s+" + std::to_string(hot_line) + ":")));
}

TEST_CASE("one process: pid= narrows pprof, the page and its data to it", "[profile][browser]") {
  ProfileDaemon p;
  // Two processes of one program: the same command name, two pids.
  Workload a, b;
  const std::string mine = std::to_string(a.pid), other = std::to_string(b.pid);
  const auto [status, body] = p.get("/debug/pprof/profile?seconds=2&pid=" + mine);
  INFO(p.d->log());
  REQUIRE(status == "200");
  const std::string file = p.s.dir + "/one-process.pb.gz";
  std::ofstream(file) << body;
  // Every sample's labels, as pprof reads them: the one pid, the one command.
  const std::string tags =
      run_capture("HOME=" + p.s.dir + " go tool pprof -tags -symbolize=none " + file + " 2>&1");
  INFO(tags);
  const std::regex pid_values(R"(\n\s*pid: Total[^\n]*((\n\s+[^\n]*\(\s*[0-9.]+%\):[^\n]*)+))");
  std::smatch m;
  REQUIRE(std::regex_search(tags, m, pid_values));
  const std::string pids = m[1];
  CHECK_THAT(pids, Contains(mine));
  CHECK_THAT(pids, !Contains(other));
  CHECK(std::count(pids.begin(), pids.end(), '%') == 1);  // one value, 100%
  // The page's data: only the other process's nodes under the root: the workload's, and
  // the test's name where a sample caught the child between its spawn and its exec.
  const auto [data_status, data] = p.get("/profile/data?seconds=10&group=process&pid=" + other);
  REQUIRE(data_status == "200");
  const auto json = nlohmann::json::parse(data);
  std::set<std::string> names;
  for (const auto& c : json["root"]["c"]) names.insert(c["n"].get<std::string>());
  INFO("processes: " << Catch::Detail::stringify(names));
  CHECK(names.contains("profile_workloa (" + other + ")"));
  for (const auto& n : names) {
    CHECK((n == "profile_workloa (" + other + ")" || n == "e2e_tests (" + other + ")"));
  }
  // The page opened with the parameter draws that process alone, and says so.
  const std::string url = p.page_url("/profile?seconds=10&group=process&pid=" + mine);
  const std::string chromium = p.chromium();
  const std::string dom = run_capture(chromium + "--dump-dom '" + url + "' 2>/dev/null");
  REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
  CHECK_THAT(dom, Contains("data-name=\"profile_workloa (" + mine + ")\""));
  CHECK_THAT(dom, !Contains("data-name=\"profile_workloa (" + other + ")\""));
  CHECK_THAT(dom, Contains("Only pid " + mine));
  CHECK_THAT(dom, Contains("/debug/pprof/profile?seconds=30&amp;pid=" + mine));
  keep_screenshot(chromium, url, "profile-one-process.png");
  // A bad narrowing: 400 with the reason.
  const auto bad = p.get("/debug/pprof/profile?seconds=1&pid=0");
  CHECK(bad.first == "400");
  CHECK_THAT(bad.second, Contains("pid is not a process or thread ID"));
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
  // The workload's process alone: what else the host runs meanwhile does not thin it out.
  const WalkedWorkload w = profile_workload(p, PROFILE_WORKLOAD_FP);
  const std::string url =
      p.page_url("/profile?" + w.range + "&group=process&view=wall&pid=" + std::to_string(w.pid));
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

// A bar of the flame graph page as the browser drew it: its function, where it stands (in
// percent of the page's width) and its depth (18 px a level, the root at 0).
struct Bar {
  std::string name;
  double left, width;
  int depth;
};
std::vector<Bar> bars_of(const std::string& dom) {
  const std::regex bar(R"re(<div class="f[^"]*"[^>]*>)re");
  const std::regex name_of(R"re(data-name="([^"]*)")re"),
      place_of(R"re(left: ([0-9.]+)%; width: ([0-9.]+)%; top: ([0-9]+)px)re");
  std::vector<Bar> bars;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), bar); it != std::sregex_iterator();
       ++it) {
    const std::string tag = it->str();
    std::smatch name, place;
    if (!std::regex_search(tag, name, name_of) || !std::regex_search(tag, place, place_of))
      continue;
    bars.push_back({name[1], std::stod(place[1]), std::stod(place[2]), std::stoi(place[3]) / 18});
  }
  return bars;
}
// The width of the bars of `chain`'s first function (the innermost) that stand, level by
// level, under bars of the others in turn (`chain` innermost first, its last the outermost).
double width_under(const std::vector<Bar>& bars, const std::vector<std::string>& chain) {
  const auto parent_of = [&](const Bar& b) -> const Bar* {
    for (const Bar& p : bars) {
      if (p.depth == b.depth - 1 && p.left <= b.left + 1e-3 &&
          b.left + b.width <= p.left + p.width + 1e-3)
        return &p;
    }
    return nullptr;
  };
  double width = 0;
  for (const Bar& b : bars) {
    if (b.name != chain.front()) continue;
    const Bar* at = &b;
    std::size_t i = 1;
    for (; i < chain.size(); ++i) {
      at = parent_of(*at);
      if (!at || at->name != chain[i]) break;
    }
    if (i == chain.size()) width += b.width;
  }
  return width;
}
// Writes `prefix` over the first four bytes of the GNU build ID of ELF file `path` (a
// 20-byte note: namesz 4, descsz 20, type NT_GNU_BUILD_ID, "GNU"). False if it has none.
bool set_build_id_prefix(const std::string& path, std::uint32_t prefix) {
  std::string bytes = read_file(path);
  static const char kNote[] = {4, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0};
  const auto at = bytes.find(std::string(kNote, sizeof kNote));
  if (at == std::string::npos) return false;
  std::memcpy(&bytes[at + sizeof kNote], &prefix, sizeof prefix);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return true;
}

// The time (`key`: "on" or "off") of every node named `name` in a /profile/data tree.
double node_time(const nlohmann::json& node, const std::string& name, const std::string& key) {
  double sum = node.value("n", "") == name ? node.value(key, 0.0) : 0.0;
  for (const auto& c : node.value("c", nlohmann::json::array())) sum += node_time(c, name, key);
  return sum;
}

// The CPU time so far (ns, the scheduler's own count) of the thread of process `pid` whose
// /proc syscall file begins with `syscall` (the system call it is blocked in: "0 " read),
// looked for up to five seconds; -1 when none is found.
double cpu_ns_of_thread_in(pid_t pid, const std::string& syscall) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (int look = 0; look < 500; ++look) {
    for (const auto& t : std::filesystem::directory_iterator(task)) {
      if (read_file(t.path().string() + "/syscall").rfind(syscall, 0) != 0) continue;
      double ns = -1;
      std::ifstream(t.path().string() + "/schedstat") >> ns;  // se.sum_exec_runtime
      return ns;
    }
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

double width_of(const std::vector<Bar>& bars, const std::string& name) {
  double width = 0;
  for (const Bar& b : bars) width += b.name == name ? b.width : 0;
  return width;
}

}  // namespace

TEST_CASE(
    "the flame graph page in a real browser: a workload built without frame pointers stands on "
    "main, and its blocked reader on its thread's start",
    "[profile][browser][unwind]") {
  // Every user-mode sample's stack walked in the kernel at 997 Hz on every busy CPU.
  ProfileDaemon p;
  const WalkedWorkload w = profile_workload(p, PROFILE_WORKLOAD_NOFP);
  const std::string url =
      p.page_url("/profile?" + w.range + "&group=process&view=wall&pid=" + std::to_string(w.pid));
  const std::string chromium = p.chromium();
  const std::string dom = run_capture(chromium + "--dump-dom '" + url + "' 2>/dev/null");
  REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
  const std::vector<Bar> bars = bars_of(dom);
  INFO(bars.size() << " bars");
  // How the daemon's walks ended (a cut walk keeps the frames it found and says why), for a
  // failure's message.
  const std::string walks = [&] {
    std::istringstream m(p.get("/metrics", true, "5").second);
    std::string out;
    for (std::string line; std::getline(m, line);) {
      if (line.rfind("ebpf_metricsd_profile_unwinds_total{", 0) == 0 ||
          line.rfind("ebpf_metricsd_profile_unwind_tables_total{", 0) == 0 ||
          line.rfind("ebpf_metricsd_profile_samples_total{", 0) == 0)
        out += line + "; ";
    }
    return out;
  }();
  INFO(walks);
  // The on-CPU leaves, each under its callers down to main; the reader's wait in read(),
  // called through the C library, under wait_on_pipe and its callers to the thread's start.
  const std::vector<std::vector<std::string>> chains = {
      {"hot_three", "one_round", "run_rounds", "main"},
      {"hot_one", "one_round", "run_rounds", "main"},
      {"compare_slowly"},
      {"wait_on_pipe", "read_all", "reader"},
  };
  for (const auto& chain : chains) {
    const double all = width_of(bars, chain.front());
    INFO(chain.front() << ": " << all << "% of the page");
    REQUIRE(all > 0);
    if (chain.size() > 1) CHECK(width_under(bars, chain) >= 0.95 * all);
  }
  // qsort's callback: under qsort's frames (the C library's, without frame pointers), then
  // sort_round and its callers to main.
  double sorted = 0;
  for (const Bar& b : bars) {
    if (b.name != "sort_round") continue;
    const std::vector<Bar> below = [&] {
      std::vector<Bar> v;
      for (const Bar& c : bars) {
        if (c.depth > b.depth && c.left >= b.left - 1e-3 &&
            c.left + c.width <= b.left + b.width + 1e-3)
          v.push_back(c);
      }
      return v;
    }();
    sorted += width_of(below, "compare_slowly");
    CHECK(width_under(bars, {"sort_round", "one_round", "run_rounds", "main"}) > 0);
  }
  CHECK(sorted >= 0.95 * width_of(bars, "compare_slowly"));
  keep_screenshot(chromium, url, "profile-flame-graph-no-frame-pointers.png");
}

TEST_CASE(
    "the page's views in a real browser: on-CPU first, off-CPU without idle waits until asked, "
    "one process's threads with their time",
    "[profile][browser]") {
  ProfileDaemon p;
  // Idle beside the known workload: a shell that waits for its children (wait4), each a
  // sleep (clock_nanosleep), and the host's kernel threads.
  pid_t idler = 0;
  {
    char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                    const_cast<char*>("while :; do sleep 0.05; done"), nullptr};
    REQUIRE(posix_spawn(&idler, "/bin/sh", nullptr, nullptr, argv, environ) == 0);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{idler};
  // Blocked for the whole test: a `cat` reading a pipe nothing is written to (a read(), not
  // an idle wait), from before the daemon's first read.
  int never[2];
  REQUIRE(pipe2(never, O_CLOEXEC) == 0);
  pid_t blocked = 0;
  {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, never[0], STDIN_FILENO);
    char* argv[] = {const_cast<char*>("cat"), nullptr};
    REQUIRE(posix_spawn(&blocked, "/bin/cat", &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
  }
  const auto blocked_since = std::chrono::steady_clock::now();
  Reap reap_blocked{blocked};
  struct Close {
    int* fds;
    ~Close() {
      close(fds[0]);
      close(fds[1]);
    }
  } close_never{never};
  Workload w;
  const std::string pid = std::to_string(w.pid);
  const bool seen = wait_until(
      [&] {
        const auto on = p.get("/profile/data?seconds=60&view=on");
        const auto off = p.get("/profile/data?seconds=60&view=off&idle=1");
        return on.second.find("hot_one") != std::string::npos &&
               off.second.find("wait_on_pipe") != std::string::npos &&
               off.second.find("\"sleep (") != std::string::npos;
      },
      30s);
  REQUIRE(seen);
  std::this_thread::sleep_for(3s);
  const std::string chromium = p.chromium();
  const auto dom_of = [&](const std::string& path) {
    const std::string dom =
        run_capture(chromium + "--dump-dom '" + p.page_url(path) + "' 2>/dev/null");
    REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
    return dom;
  };
  const auto has_bar = [](const std::vector<Bar>& bars, const std::string& prefix) {
    return std::any_of(bars.begin(), bars.end(),
                       [&](const Bar& b) { return b.name.rfind(prefix, 0) == 0; });
  };

  // Opened plainly: on-CPU time, the busy program first in the list of processes.
  const std::string on = dom_of("/profile?seconds=60");
  const auto on_bars = bars_of(on);
  CHECK(width_of(on_bars, "hot_one") > 0);
  {
    // The reader blocks in read(2) through wait_on_pipe(), but is on a CPU inside it now and
    // then (entering, being woken, copying the byte): at most its thread's own CPU time,
    // which the kernel keeps (schedstat). Samples are 1/997 s each and fall where the CPU is
    // at that instant: the reader's count is binomial around its CPU time, so three standard
    // deviations and two samples more.
    const auto on_data = nlohmann::json::parse(p.get("/profile/data?seconds=60&view=on").second);
    const double reader_ns = cpu_ns_of_thread_in(w.pid, "0 ");  // blocked in read (syscall 0)
    REQUIRE(reader_ns >= 0);
    const double period_ns = 1e9 / 997, expected = reader_ns / period_ns;
    const double bound_ns = (expected + 3 * std::sqrt(expected) + 2) * period_ns;
    const double sampled_ns = node_time(on_data["root"], "wait_on_pipe", "on");
    INFO("wait_on_pipe on a CPU " << sampled_ns << " ns; its thread's CPU time " << reader_ns
                                  << " ns");
    CHECK(sampled_ns <= bound_ns);
  }
  CHECK_THAT(on, Contains("Processes with the most on-CPU time"));
  // The list, most on-CPU time first: the busy program is in it (first on a quiet host; a
  // CPU-bound job beside the tests can lead it), and its link is the one to follow.
  const std::regex process_row(R"re(<tr><td><a href="([^"]*pid=[0-9]+[^"]*)">([0-9]+)</a>)re");
  std::smatch row;
  std::string workload_link;
  for (auto it = std::sregex_iterator(on.begin(), on.end(), process_row);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[2] == pid) workload_link = (*it)[1];
  }
  CHECK_FALSE(workload_link.empty());
  {
    const auto listed = nlohmann::json::parse(p.get("/profile/data?seconds=60").second);
    REQUIRE(listed["processes"].size() >= 1);
    double most = 0;
    for (const auto& x : listed["processes"]) most = std::max(most, x["on"].get<double>());
    CHECK(listed["processes"][0]["on"].get<double>() == most);
  }
  keep_screenshot(chromium, p.page_url("/profile?seconds=60"), "profile-view-on-cpu.png");

  // Off-CPU of the whole host: the blocked reader; the idle waits (the shell's, the sleeps',
  // the kernel threads') set apart and said so.
  const std::string off = dom_of("/profile?seconds=60&view=off");
  const auto off_bars = bars_of(off);
  CHECK(width_of(off_bars, "wait_on_pipe") > 0);
  CHECK_FALSE(has_bar(off_bars, "kworker/"));
  CHECK_THAT(off, Contains("Idle waits, set apart:"));
  CHECK_THAT(off, Contains("clock_nanosleep"));
  keep_screenshot(chromium, p.page_url("/profile?seconds=60&view=off"), "profile-view-off-cpu.png");
  // One click shows them.
  const std::regex toggle(R"re(<a id="idle-toggle" href="\?([^"]*)")re");
  REQUIRE(std::regex_search(off, row, toggle));
  const std::string shown_path =
      "/profile?" + std::regex_replace(row[1].str(), std::regex("&amp;"), "&");
  CHECK_THAT(shown_path, Contains("idle=1"));
  const std::string shown = dom_of(shown_path);
  CHECK(width_of(bars_of(shown), "wait_on_pipe") > 0);
  CHECK_THAT(shown, Contains("Idle waits, shown:"));
  keep_screenshot(chromium, p.page_url(shown_path), "profile-view-off-cpu-idle.png");
  // The same two views' data: the sleeps' waits are all idle, the shell's wait4 too (its
  // vfork of each sleep is not: a wait for the child's exec).
  const auto time_of = [](const nlohmann::json& j, const std::string& prefix) {
    double sum = 0;
    for (const auto& c : j["root"].value("c", nlohmann::json::array())) {
      if (c["n"].get<std::string>().rfind(prefix, 0) == 0) sum += c["off"].get<double>();
    }
    return sum;
  };
  const auto hidden_data = nlohmann::json::parse(p.get("/profile/data?seconds=60&view=off").second);
  const auto shown_data =
      nlohmann::json::parse(p.get("/profile/data?seconds=60&view=off&idle=1").second);
  // The sleeps' time asleep (under a frame that names nanosleep): each sleep's exec and page
  // faults are waits too, not idle ones, and a slower machine makes them a larger part.
  const auto asleep = [](const nlohmann::json& j) {
    const std::function<double(const nlohmann::json&)> under = [&](const nlohmann::json& n) {
      if (n.value("n", "").find("nanosleep") != std::string::npos) return n.value("off", 0.0);
      double sum = 0;
      for (const auto& c : n.value("c", nlohmann::json::array())) sum += under(c);
      return sum;
    };
    double sum = 0;
    for (const auto& c : j["root"].value("c", nlohmann::json::array())) {
      if (c["n"].get<std::string>().rfind("sleep (", 0) == 0) sum += under(c);
    }
    return sum;
  };
  const std::string shell = "sh (" + std::to_string(idler) + ")";
  INFO("sleeps: " << time_of(hidden_data, "sleep (") << " ns shown of "
                  << time_of(shown_data, "sleep (") << ", asleep " << asleep(hidden_data) << " of "
                  << asleep(shown_data) << "; the shell: " << time_of(hidden_data, shell) << " of "
                  << time_of(shown_data, shell));
  CHECK(asleep(shown_data) > 0);
  CHECK(asleep(hidden_data) < 0.01 * asleep(shown_data));
  CHECK(time_of(hidden_data, shell) < 0.5 * time_of(shown_data, shell));
  CHECK(hidden_data["idle"]["ns"].get<double>() >= time_of(shown_data, "sleep ("));
  // The blocked program: its one wait, still in progress, fills the window, no more, in the
  // kernel's pipe read it sleeps in.
  {
    std::this_thread::sleep_until(blocked_since + 8s);  // blocked for all of the last 5 s
    const auto last = nlohmann::json::parse(p.get("/profile/data?seconds=5&view=off").second);
    const double window_ns = last["seconds"].get<double>() * 1e9;
    const std::string cat = "cat (" + std::to_string(blocked) + ")";
    INFO("the blocked cat: " << time_of(last, cat) << " ns of a window of " << window_ns);
    CHECK(time_of(last, cat) <= window_ns * 1.001);
    CHECK(time_of(last, cat) >= window_ns * 0.98);
    CHECK_THAT(last["root"].dump(), Contains("pipe_read"));
  }

  // The busy program picked from the list: its threads, each with its time on and off the
  // CPU and its coverage, none more than the window.
  REQUIRE_FALSE(workload_link.empty());
  const std::string picked =
      "/profile" + std::regex_replace(workload_link, std::regex("&amp;"), "&");
  CHECK_THAT(picked, Contains("pid=" + pid));
  CHECK_THAT(picked, Contains("group=thread"));
  CHECK_THAT(picked, Contains("view=on"));
  const std::string wall = std::regex_replace(picked, std::regex("view=on"), "view=wall");
  const std::string threads = dom_of(wall);
  CHECK_THAT(threads, Contains("Threads: time in the window"));
  const auto thread_bars = bars_of(threads);
  CHECK(has_bar(thread_bars, "profile_workloa ("));
  CHECK(width_of(thread_bars, "wait_on_pipe") > 0);
  CHECK(width_of(thread_bars, "hot_one") > 0);
  keep_screenshot(chromium, p.page_url(wall), "profile-threads.png");
  const auto data = nlohmann::json::parse(
      p.get("/profile/data?seconds=5&view=wall&group=thread&pid=" + pid).second);
  const double window_ns = data["seconds"].get<double>() * 1e9;
  REQUIRE(data["threads"].size() >= 2);
  CHECK(data["threads_exact"] == true);
  for (const auto& t : data["threads"]) {
    CHECK(t.contains("runq"));
    INFO("thread " << t.dump() << " in a window of " << window_ns << " ns");
    CHECK(t["pid"] == w.pid);
    CHECK(t["on"].get<double>() + t["off"].get<double>() <= window_ns * 1.02);
  }
}

namespace {

// The time `go tool pprof` gives function `name` in `top` (its lines as -top -unit=ms prints
// them: flat flat% sum% cum cum% name), the cum column in ms; nullopt when it lists none.
std::optional<double> pprof_cum_ms(const std::string& top, const std::string& name) {
  std::istringstream in(top);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string flat, flat_share, sum, cum, cum_share, function;
    if (fields >> flat >> flat_share >> sum >> cum >> cum_share >> function && function == name &&
        cum.size() > 2 && cum.substr(cum.size() - 2) == "ms") {
      return std::stod(cum.substr(0, cum.size() - 2));
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE(
    "before and after: a differential flame graph of two kept windows, as pprof -diff_base "
    "-normalize says, and a range older than what is kept said plainly",
    "[profile][browser]") {
  ProfileDaemon p;
  Workload w;
  REQUIRE(wait_until(
      [&] {
        return p.get("/profile/data?seconds=60&view=on").second.find("hot_three") !=
               std::string::npos;
      },
      30s));
  // The known workload alone, then with a shell spinning beside it: hot_three's share of the
  // host's CPU time shrinks (the burner takes a CPU of its own), the shell's grows from none.
  std::this_thread::sleep_for(4s);
  const std::uint64_t t1 = unix_ms_now();
  pid_t burner = 0;
  {
    char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                    const_cast<char*>("while :; do :; done"), nullptr};
    REQUIRE(posix_spawn(&burner, "/bin/sh", nullptr, nullptr, argv, environ) == 0);
  }
  std::this_thread::sleep_for(4s);
  kill(burner, SIGKILL);
  waitpid(burner, nullptr, 0);
  const std::uint64_t t2 = unix_ms_now();
  const std::uint64_t t0 = 2 * t1 - t2;
  std::this_thread::sleep_for(2s);  // a read of the kernel side after t2
  const auto range = [](std::uint64_t from, std::uint64_t to) {
    return "from=" + std::to_string(from) + "&to=" + std::to_string(to);
  };

  // The data of the differential view: the newer window's time, and the one before's at each
  // node ("b").
  const std::string data_path = "/profile/data?" + range(t1, t2) + "&compare=before&view=on";
  const auto diff = nlohmann::json::parse(p.get(data_path + "&group=none").second);
  REQUIRE(diff.contains("base"));
  const double total = diff["root"]["on"].get<double>(),
               base_total = diff["root"]["b"].get<double>();
  REQUIRE(total > 0);
  REQUIRE(base_total > 0);
  // hot_three's time in each window, over every node of it.
  std::function<std::pair<double, double>(const nlohmann::json&, const std::string&)> time_of =
      [&](const nlohmann::json& n, const std::string& name) {
        if (n["n"] == name) return std::make_pair(n["on"].get<double>(), n["b"].get<double>());
        std::pair<double, double> sum{0, 0};
        for (const auto& c : n.value("c", nlohmann::json::array())) {
          const auto [now, before] = time_of(c, name);
          sum.first += now;
          sum.second += before;
        }
        return sum;
      };
  const auto [now, before] = time_of(diff["root"], "hot_three");
  const double change = now / total - before / base_total;
  INFO("hot_three: " << now / 1e6 << " ms of " << total / 1e6 << " ms, before " << before / 1e6
                     << " ms of " << base_total / 1e6 << " ms");
  CHECK(change < 0);
  const auto by_process = nlohmann::json::parse(p.get(data_path + "&group=process").second);
  const std::string shell = "sh (" + std::to_string(burner) + ")";
  const auto shell_node =
      std::find_if(by_process["root"]["c"].begin(), by_process["root"]["c"].end(),
                   [&](const auto& c) { return c["n"] == shell; });
  REQUIRE(shell_node != by_process["root"]["c"].end());
  CHECK((*shell_node)["on"].get<double>() > 0);
  CHECK((*shell_node)["b"] == 0);

  // The same two windows as pprof files: -diff_base with -normalize gives hot_three the same
  // change of share (it scales the newer profile to the base's total: its ms are the change
  // times the base's total, its cum% the change).
  const auto fetch = [&](std::uint64_t from, std::uint64_t to, const std::string& name) {
    const auto [status, body] = p.get("/debug/pprof/profile?" + range(from, to));
    REQUIRE(status == "200");
    const std::string file = p.s.dir + "/" + name;
    std::ofstream(file) << body;
    return file;
  };
  const std::string newer = fetch(t1, t2, "newer.pb.gz"), older = fetch(t0, t1, "older.pb.gz");
  const std::string top =
      run_capture("HOME=" + p.s.dir + " go tool pprof -top -unit=ms -nodecount=10000 -normalize " +
                  "-sample_index=cpu -symbolize=none -diff_base " + older + " " + newer + " 2>&1");
  INFO(top);
  const auto pprof = pprof_cum_ms(top, "hot_three");
  REQUIRE(pprof);
  const double ours = change * base_total / 1e6;
  INFO("ours " << ours << " ms, pprof " << *pprof << " ms");
  CHECK(std::abs(*pprof - ours) <= std::max(0.5, 0.01 * std::abs(ours)));

  // The page: the bars of the newer window, hot_three's coloured as shrunk, the legend said.
  const std::string chromium = p.chromium();
  const std::string url = p.page_url("/profile?" + range(t1, t2) + "&compare=before&view=on");
  const std::string dom = run_capture(chromium + "--dump-dom '" + url + "' 2>/dev/null");
  REQUIRE_THAT(dom, Contains("data-loaded=\"1\""));
  const std::regex hot(
      R"re(<div class="f[^"]*"[^>]*data-name="hot_three"[^>]*data-change="(-?[0-9.]+)")re");
  std::smatch m;
  REQUIRE(std::regex_search(dom, m, hot));
  CHECK(std::stod(m[1]) < 0);
  CHECK_THAT(dom, Contains("both windows are normalized to their own totals"));
  CHECK_THAT(dom, !Contains("<p id=\"diff-legend\" hidden"));
  keep_screenshot(chromium, url, "profile-differential.png");

  // The last ten minutes, most of them from before the daemon started: what it keeps, and
  // the page says so.
  const std::string old_url = p.page_url("/profile?" + range(t2 - 600'000, t2) + "&view=on");
  const std::string old_dom = run_capture(chromium + "--dump-dom '" + old_url + "' 2>/dev/null");
  REQUIRE_THAT(old_dom, Contains("data-loaded=\"1\""));
  CHECK_THAT(old_dom, Contains("The daemon keeps profiles from"));
  // Bad ranges: a 400 that says why.
  CHECK_THAT(p.get("/debug/pprof/profile?from=" + std::to_string(t1)).second,
             Contains("from and to go together"));
  CHECK_THAT(p.get("/debug/pprof/profile?" + range(t2, t1)).second,
             Contains("to must be after from"));
  CHECK_THAT(p.get("/debug/pprof/profile?seconds=3&" + range(t1, t2)).second,
             Contains("give seconds, or from and to"));

  // The shipped dashboard's latency panels link each series to its daemon's page over the
  // panel's range, and to its slow events there: filled in as Grafana fills them, the data
  // of both answer (a dashboard's hour, far longer than what is kept, too).
  const auto dashboard =
      nlohmann::json::parse(read_file(SOURCE_DIR "/dashboards/ebpf-metricsd.json"));
  int linked = 0;
  for (const auto& panel : dashboard["panels"]) {
    if (panel["title"] != "Syscall latency p50 / p99, all syscalls") continue;
    for (const auto& l : panel["fieldConfig"]["defaults"]["links"]) {
      std::string link = l["url"];
      link = replace_all(link, "${scheme}", "https");
      link =
          replace_all(link, "${__field.labels.instance}", "127.0.0.1:" + std::to_string(p.s.port));
      link = replace_all(link, "${__from}", std::to_string(t2 - 3'600'000));
      link = replace_all(link, "${__to}", std::to_string(t2));
      const std::string data_link = replace_all(link, "/profile?", "/profile/data?");
      INFO(data_link);
      REQUIRE(data_link != link);
      const std::string body = run_capture("curl -sk -u " + std::string(kUser) + ":" + kPassword +
                                           " '" + data_link + "'");
      const auto j = nlohmann::json::parse(body, nullptr, false);
      REQUIRE(j.is_object());
      CHECK(j.contains("root"));
      ++linked;
    }
  }
  CHECK(linked == 2);

  // A reload that keeps profiles longer keeps what is held: the same two windows answer
  // alike, and windows up to the new retention are served.
  CHECK_THAT(p.get("/profile/data?seconds=1200").second, Contains("at most 600"));
  p.s.prepend("profiles:\n  retention: 20m\n");
  kill(p.d->pid(), SIGHUP);
  REQUIRE(wait_until([&] { return p.d->log().find("reload done") != std::string::npos; }, 30s));
  const auto again = nlohmann::json::parse(p.get(data_path + "&group=none").second);
  CHECK(again["root"]["on"] == diff["root"]["on"]);
  CHECK(again["root"]["b"] == diff["root"]["b"]);
  const auto longer = nlohmann::json::parse(p.get("/profile/data?seconds=1200").second);
  CHECK(longer["kept_s"] == 1200);
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

TEST_CASE("hostile files mapped by a process: refused and counted, scrapes and profiles go on",
          "[profile][hostile][sanitize]") {
  ProfileDaemon p;
  const std::string dir = p.s.dir + "/files";
  REQUIRE(run_command("mkdir -p " + dir) == 0);
  const std::string elf = PROFILE_WORKLOAD_FP;
  // A file cut in half, one whose section table lies a terabyte past its end, a sparse file
  // of 2 GiB, one whose .gnu_debuglink names a FIFO, and one its owner truncates while it is
  // mapped.
  REQUIRE(run_command("head -c $(( $(stat -c %s " + elf + ") / 2 )) " + elf + " > " + dir +
                      "/cut.so") == 0);
  REQUIRE(run_command("cp " + elf + " " + dir +
                      "/far.so && printf '\\000\\000\\000\\000\\000"
                      "\\001\\000\\000' | dd of=" +
                      dir + "/far.so bs=1 seek=40 conv=notrunc status=none") == 0);
  REQUIRE(run_command("truncate -s 2G " + dir + "/sparse.so") == 0);
  REQUIRE(run_command("cd " + dir + " && cp " + elf +
                      " link.so && : > link.debug &&"
                      " objcopy --add-gnu-debuglink=link.debug link.so && rm link.debug &&"
                      " mkfifo link.debug") == 0);
  REQUIRE(run_command("cp " + elf + " " + dir + "/shrinks.so") == 0);
  const std::vector<std::string> files = {"cut.so", "far.so", "sparse.so", "link.so", "shrinks.so"};

  // A process that maps them all to execute and burns CPU, so that it is sampled and its
  // mappings read.
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t mapper = fork();
  REQUIRE(mapper >= 0);
  if (mapper == 0) {
    for (const auto& f : files) {
      const int fd = ::open((dir + "/" + f).c_str(), O_RDONLY);
      if (fd < 0 || mmap(nullptr, 65536, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
        _exit(3);
      close(fd);
    }
    (void)!write(ready[1], "x", 1);
    for (;;) __asm__ volatile("" ::: "memory");
  }
  close(ready[1]);
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);

  const auto refused = [&](const std::string& reason) {
    const auto m = p.get("/metrics", true, "5");
    std::smatch v;
    const std::regex line("\nebpf_metricsd_profile_files_refused_total\\{reason=\"" + reason +
                          "\"\\} ([0-9]+)\n");
    return m.first == "200" && std::regex_search(m.second, v, line) ? std::stod(v[1]) : -1.0;
  };
  // A profile while it runs; its owner truncates one mapped file in the middle of it.
  std::pair<std::string, std::string> profile;
  std::thread asking([&] { profile = p.get("/debug/pprof/profile?seconds=4"); });
  std::this_thread::sleep_for(2s);
  REQUIRE(run_command("truncate -s 0 " + dir + "/shrinks.so") == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto scrape = p.get("/metrics", true, "5");
  const double scrape_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  asking.join();
  const bool counted =
      wait_until([&] { return refused("bad_tables") >= 2 && refused("too_large") >= 1; }, 30s);
  kill(mapper, SIGKILL);
  waitpid(mapper, nullptr, 0);
  INFO(p.d->log());
  // The scrape's answer came within its client's limit (5 s), however slow the machine: the
  // files being refused did not hold it up.
  INFO("the scrape took " << scrape_s << " s");
  CHECK(scrape.first == "200");
  CHECK(profile.first == "200");
  // cut.so and far.so: tables outside the file; sparse.so: past the size cap.
  CHECK(counted);
  CHECK(refused("not_regular") == 0);
  // Alive and answering.
  CHECK(kill(p.d->pid(), 0) == 0);
  CHECK(p.get("/debug/pprof/profile?seconds=1").first == "200");
}

TEST_CASE("the profile's memory budget: 200 distinct binaries starting and exiting",
          "[profile][budget]") {
  // Unwinding with CFI at 997 Hz while 2,000 short processes run from 200 copies of the
  // workload built without frame pointers (a file each: its own ELF to check, name and
  // unwind with). The daemon's peak RSS (anonymous and file-backed) and its BPF maps'
  // memory stay under 100 MiB, each page counted once.
  ProfileDaemon p("    unwind: cfi\n");
  const std::string bins = p.s.dir + "/bins";
  REQUIRE(run_command("mkdir -p " + bins + " && for i in $(seq 200); do cp " +
                      std::string(PROFILE_WORKLOAD_NOFP) + " " + bins + "/w$i; done") == 0);
  // Each its own program, as distinct programs are: a build ID of its own.
  for (int i = 1; i <= 200; ++i) {
    REQUIRE(set_build_id_prefix(bins + "/w" + std::to_string(i), static_cast<std::uint32_t>(i)));
  }
  for (int pass = 0; pass < 10; ++pass) {
    // 200 at once, 20 ms of CPU and one 20 ms wait each.
    REQUIRE(run_command("for i in $(seq 200); do " + bins + "/w$i 20 1 >/dev/null & done; wait") ==
            0);
  }
  CHECK(p.get("/debug/pprof/profile?seconds=1").first == "200");
  const auto kib = [&](const std::string& field) {
    std::ifstream in("/proc/" + std::to_string(p.d->pid()) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
    }
    return -1.0;
  };
  // The memory of the daemon's BPF maps, as the kernel charges it (fdinfo's memlock), each
  // map once however many descriptors the daemon holds of it (the walker's maps are shared
  // with every object that walks). Per-CPU maps (types 5, 6, 10: per-CPU hash, array, LRU
  // hash) hold a value per possible CPU: their part grows with the host's CPUs, and is
  // stated per CPU.
  double maps_kib = 0, per_cpu_kib = 0;
  std::set<long> map_ids;
  const std::string fds = "/proc/" + std::to_string(p.d->pid()) + "/fdinfo";
  for (const auto& e : std::filesystem::directory_iterator(fds)) {
    std::ifstream in(e.path());
    int type = -1;
    long id = -1;
    double memlock = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("map_type:", 0) == 0) type = std::stoi(line.substr(9));
      if (line.rfind("map_id:", 0) == 0) id = std::stol(line.substr(7));
      if (line.rfind("memlock:", 0) == 0) memlock = std::stod(line.substr(8)) / 1024;
    }
    if (type < 0 || !map_ids.insert(id).second) continue;
    maps_kib += memlock;
    if (type == 5 || type == 6 || type == 10) per_cpu_kib += memlock;
  }
  const long cpus = libbpf_num_possible_cpus();
  // What of them the daemon maps (rings, skeletons' globals) is in its RSS too: counted
  // once, with the maps. Mapped pages stay resident while the daemon runs, so the end's
  // figure is what the peak held (the rings had wrapped long before).
  double mapped_maps_kib = 0;
  {
    std::ifstream smaps("/proc/" + std::to_string(p.d->pid()) + "/smaps");
    bool bpf_map = false;
    for (std::string line; std::getline(smaps, line);) {
      if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
          line.find('-') < line.find(' ')) {
        bpf_map = line.find("anon_inode:bpf-map") != std::string::npos;
      } else if (bpf_map && line.rfind("Rss:", 0) == 0) {
        mapped_maps_kib += std::stod(line.substr(4));
      }
    }
  }
  const double peak = kib("VmHWM") - mapped_maps_kib;
  const auto metrics = p.get("/metrics", true, "5").second;
  std::string caches;
  const std::regex cache_line("\nebpf_metricsd_profile_(cache_entries|memory_bytes)[^\n]*");
  for (std::sregex_iterator it(metrics.begin(), metrics.end(), cache_line);
       it != std::sregex_iterator(); ++it)
    caches += it->str();
  const std::string rollup = read_file("/proc/" + std::to_string(p.d->pid()) + "/smaps_rollup");
  const std::string maps = run_capture(
      "bpftool map show 2>/dev/null | grep -B0 -A2 '' | "
      "awk '/memlock/ {print prev \" \" $0} {prev=$0}' | "
      "sort -k2 -t'k' | tail -n 8");
  INFO("peak RSS " << peak / 1024 << " MiB without " << mapped_maps_kib / 1024
                   << " MiB of mapped BPF maps, BPF maps " << maps_kib / 1024 << " MiB, of them "
                   << per_cpu_kib << " KiB per-CPU maps ("
                   << per_cpu_kib / static_cast<double>(cpus) << " KiB per possible CPU, " << cpus
                   << " CPUs); the profile's parts:" << caches << "\n"
                   << rollup);
  REQUIRE(peak > 0);
  CHECK(peak + maps_kib < 100 * 1024);
  WARN("peak RSS " << peak / 1024 << " MiB without " << mapped_maps_kib / 1024
                   << " MiB of mapped BPF maps, BPF maps " << maps_kib / 1024 << " MiB");
}

TEST_CASE("the page by keyboard: search, zoom, back; and its render time at the node cap",
          "[profile][browser]") {
  // tests/e2e/page_driver.py drives headless Chromium over the DevTools protocol, key by
  // key, and reports what the page showed.
  ProfileDaemon p;
  Workload w;
  const std::string pid = std::to_string(w.pid);
  const bool seen = wait_until(
      [&] {
        return p.get("/profile/data?seconds=60&view=on&pid=" + pid).second.find("\"hot_one\"") !=
               std::string::npos;
      },
      30s);
  REQUIRE(seen);
  std::this_thread::sleep_for(2s);
  const std::string driver =
      "timeout 300 /usr/bin/python3 " SOURCE_DIR "/tests/e2e/page_driver.py ";
  const std::string args = p.base + " " + kUser + " " + kPassword + " ";
  const std::string shots = BINARY_DIR "/test-artifacts";
  const std::string keys =
      run_capture(driver + "keyboard " + args + "'/profile?pid=" + pid + "' " + shots + " 2>&1");
  INFO("page driver: " << keys);
  const auto k = nlohmann::json::parse(keys.substr(keys.rfind("\n{") + 1));
  // "/" goes to the search box; typing marks hot_one; Escape clears it.
  CHECK(k["slash_focus"] == "search");
  CHECK(k["matched"].get<int>() >= 1);
  CHECK(k["status"].get<std::string>().find("matched:") != std::string::npos);
  CHECK(k["search_after_escape"] == "");
  CHECK(k["matched_after_escape"] == 0);
  // Tab reaches the graph; the arrows go down the widest callees to main and on to hot_one.
  CHECK(k["first_focused"] == "all");
  const auto path = k["path"].get<std::vector<std::string>>();
  CHECK(std::find(path.begin(), path.end(), "main") != path.end());
  CHECK(path.back() == "hot_one");
  // Enter zooms: hot_one is the whole width, and keeps the focus.
  CHECK(k["zoomed"] == nlohmann::json::array({"hot_one", "100%"}));
  CHECK(k["zoomed_focus"] == "hot_one");
  CHECK(k["history_steps_of_second_enter"] == 0);  // already there: no step to undo
  // The browser's Back returns to the whole view, Forward to the zoom, Escape zooms out.
  // The focus stays on the view's top bar, for the keys that follow.
  CHECK(k["after_back"] == k["top"]);
  CHECK(k["focus_after_back"] == k["top"][0]);
  CHECK(k["after_forward"] == nlohmann::json::array({"hot_one", "100%"}));
  CHECK(k["focus_after_forward"] == "hot_one");
  CHECK(k["after_escape"] == k["top"]);
  CHECK(k["focus_after_escape"] == k["top"][0]);
  CHECK(k["bars_after_escape"] == k["bars"]);

  // At the node cap: the daemon's data for the window with a tree of that many nodes in
  // place of its root (each wide enough to be drawn, the page's worst case).
  const std::size_t cap = ebpf_metricsd::profiling::kMaxFlameGraphNodes;
  const std::string drawn = run_capture(driver + "render " + args + "/profile " + shots + " " +
                                        std::to_string(cap) + " 2>&1");
  INFO("page driver: " << drawn);
  const auto r = nlohmann::json::parse(drawn.substr(drawn.rfind("\n{") + 1));
  CHECK(r["nodes"] == cap + 1);  // and the root
  CHECK(r["bars"] == cap + 1);
  CHECK(r["draw_ms"].get<double>() > 0);
  CHECK(r["reload_ms"].get<double>() > 0);
  CHECK(r["script_ms"].get<double>() <= r["draw_ms"].get<double>());
  WARN(cap << " nodes drawn: " << r["draw_ms"].get<double>() << " ms from a redraw to the frame "
           << "after it (" << r["script_ms"].get<double>() << " ms of it the page's script), "
           << r["reload_ms"].get<double>() << " ms for a reload");
}
