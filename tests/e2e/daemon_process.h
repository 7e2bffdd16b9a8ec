#pragma once
// Starting the built daemon and talking to it over HTTP, for the end-to-end tests.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <seccomp.h>

#include "../test_support.h"
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ebpf_metricsd::test {

// The daemon as a child process with its stderr in a file.
class DaemonProcess {
 public:
  struct Options {
    std::vector<std::string> args;
    bool deny_bpf = false;  // the bpf() syscall fails with EPERM, as without privileges
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
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (const auto& a : opts.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
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
