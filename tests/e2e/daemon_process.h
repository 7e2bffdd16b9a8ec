#pragma once
// Starting the built daemon and talking to it over HTTP, for the end-to-end tests.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <seccomp.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../test_support.h"
#include "ebpf_metricsd/tracers/registry.h"

#include <dirent.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ebpf_metricsd::test {

// The value of the first sample whose line starts with `series` (name and labels).
inline std::optional<double> sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, series.size(), series) == 0 && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

// IDs of the BPF programs or maps ("prog_id" / "map_id") a process holds open.
inline std::set<int> bpf_ids(pid_t pid, const std::string& key) {
  std::set<int> ids;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fdinfo";
  DIR* d = opendir(dir.c_str());
  if (!d) return ids;
  while (dirent* e = readdir(d)) {
    std::istringstream in(read_file(dir + "/" + e->d_name));
    std::string line;
    while (std::getline(in, line)) {
      if (line.compare(0, key.size() + 1, key + ":") == 0)
        ids.insert(std::stoi(line.substr(key.size() + 1)));
    }
  }
  closedir(d);
  return ids;
}

inline std::set<int> loaded_prog_ids() {
  std::set<int> ids;
  FILE* p = popen("bpftool prog show", "r");
  char line[512];
  while (p && fgets(line, sizeof line, p)) {
    if (line[0] >= '0' && line[0] <= '9') ids.insert(std::atoi(line));
  }
  if (p) pclose(p);
  return ids;
}

// The daemon the tests run: this build's, or the one EBPF_METRICSD_DAEMON names (the
// sanitizer build's, tests/sanitizers.sh).
inline const char* daemon_path() {
  const char* other = std::getenv("EBPF_METRICSD_DAEMON");
  return other && *other ? other : DAEMON_PATH;
}
// Whether that daemon is built with sanitizers (EBPF_METRICSD_SANITIZED=1): its exit takes
// longer, and RSS bounds mean nothing (shadow memory, freed memory quarantined).
inline bool sanitized() {
  const char* s = std::getenv("EBPF_METRICSD_SANITIZED");
  return s && std::string(s) == "1";
}

struct Setup {
  std::string dir = temp_dir();
  int port = free_port();
  std::string config = dir + "/config.yaml";
  std::string log = dir + "/daemon.log";

  explicit Setup(const std::string& tracers_yaml =
                     "  syscall_latency:\n    enabled: true\n    per_syscall: all\n") {
    std::ofstream(config) << "web:\n  listen_address: \"127.0.0.1:" << port
                          << "\"\ndrain_interval: 200ms\ntracers:\n"
                          << tracers_yaml;
  }
  ~Setup() { run_command("rm -rf " + dir); }
  // Puts top-level keys before the rest of the config.
  void prepend(const std::string& yaml) const {
    const std::string rest = read_file(config);
    std::ofstream(config) << yaml << rest;
  }
  std::vector<std::string> args() const { return {"--config", config, "--log.level", "debug"}; }
};

// Every registered tracer, enabled, as the `tracers:` entries of a config.
inline std::string all_tracers_enabled() {
  std::string yaml;
  for (const auto& d : tracer_registry()) yaml += "  " + d.name + ":\n    enabled: true\n";
  return yaml;
}

// Every tracer enabled, those whose `cgroup` is an option with `cgroup: true`.
inline std::string all_tracers_labelled() {
  std::string yaml;
  for (const auto& d : tracer_registry()) {
    yaml += "  " + d.name + ":\n    enabled: true\n";
    if (d.traits.owner == EventOwner::Task) yaml += "    cgroup: true\n";
  }
  return yaml;
}

// The daemon as a child process with its stderr in a file.
class DaemonProcess {
 public:
  struct Options {
    std::vector<std::string> args;
    bool deny_bpf = false;            // the bpf() syscall fails with EPERM, as without privileges
    std::vector<std::string> env;     // NAME=value set in the child
    std::vector<std::string> prefix;  // a command that runs the daemon (e.g. setpriv ...)
    // When not empty: every other system call fails with EPERM, as under systemd's
    // SystemCallFilter= with SystemCallErrorNumber=EPERM.
    std::vector<std::string> allow_syscalls = {};
  };

  DaemonProcess(const std::string& binary, const std::string& log_path, const Options& opts)
      : log_path_(log_path) {
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      FILE* log = std::fopen(log_path.c_str(), "w");
      if (log) dup2(fileno(log), STDERR_FILENO);
      if (opts.deny_bpf) {
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(bpf), 0);
        if (seccomp_load(ctx) != 0) _exit(111);
      }
      if (!opts.allow_syscalls.empty()) {
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
        for (const auto& name : opts.allow_syscalls) {
          const int nr = seccomp_syscall_resolve_name(name.c_str());
          if (nr != __NR_SCMP_ERROR) seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
        }
        if (seccomp_load(ctx) != 0) _exit(111);
      }
      for (const auto& e : opts.env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv;
      for (const auto& a : opts.prefix) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (const auto& a : opts.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string log() const { return read_file(log_path_); }

  // Exit status once it has exited within `timeout`, else -1.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    do {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (std::chrono::steady_clock::now() < end);
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_path_;
};

}  // namespace ebpf_metricsd::test
