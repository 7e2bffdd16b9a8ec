#pragma once
// A libbpf-tools program (runqlat, biolatency) run beside the tracer as an independent
// oracle over the same window: started before the workload, interrupted after it. Where it
// is not reliable (inside the kernel matrix's TCG guests it loses events), the
// exact oracles decide alone: tests that are nothing but such a comparison carry the tag
// [external], which the matrix leaves out, and optional second opinions ask
// external_oracles_wanted().

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

namespace ebpf_metricsd::test {

// False where EBPF_METRICSD_NO_EXTERNAL_ORACLES is set (the kernel matrix's guests).
inline bool external_oracles_wanted() {
  return std::getenv("EBPF_METRICSD_NO_EXTERNAL_ORACLES") == nullptr;
}

class OracleTool {
 public:
  // Starts `command` (a tool that prints its histogram when interrupted) and returns once
  // it printed `banner` (it prints that once attached) and catches SIGINT. Unless
  // `required`, a tool that exits without the banner is not a failure: started() says.
  OracleTool(const std::string& command, const std::string& banner, bool required = true) {
    // Line-buffered, or the banner would sit in stdio's buffer until the tool exits. Made
    // before the fork: the child of a threaded process only execs.
    const std::string line = "exec stdbuf -oL " + command;
    int out[2];
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    if (pid_ < 0) close(std::exchange(fd_, -1));
    REQUIRE(pid_ > 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (out_.find(banner) == std::string::npos && read_some(deadline)) {
    }
    started_ = out_.find(banner) != std::string::npos;
    // The banner may come before the tool's SIGINT handler (runqlat): wait for the handler.
    while (started_ && !catches_sigint() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (required && !started_) {
      stop();
      FAIL("no \"" << banner << "\" from " << command << ":\n" << out_);
    }
  }
  bool started() const { return started_; }
  const std::string& output() const { return out_; }
  ~OracleTool() { stop(); }
  OracleTool(const OracleTool&) = delete;
  OracleTool& operator=(const OracleTool&) = delete;

  // Interrupts the tool, so that its window ends here however long the workload took (a
  // fixed interval may end before a slow machine's workload does), waits for it to print
  // its histogram and exit, and returns everything it printed. SIGINT is sent again while
  // it prints nothing: one that came between its check and its sleep is not seen.
  const std::string& finish() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (fd_ >= 0 && std::chrono::steady_clock::now() < deadline) {
      kill(pid_, SIGINT);
      if (!read_some(std::chrono::steady_clock::now() + std::chrono::milliseconds(500))) break;
    }
    stop();
    return out_;
  }
  int status() const { return status_; }

  // Total count of its histogram printout ("  a -> b : count |***|").
  std::uint64_t histogram_total() const {
    std::uint64_t total = 0;
    std::istringstream in(out_);
    std::string line;
    while (std::getline(in, line)) {
      unsigned long long lo, hi, count;
      if (std::sscanf(line.c_str(), " %llu -> %llu : %llu", &lo, &hi, &count) == 3) {
        total += count;
      }
    }
    return total;
  }

 private:
  // Appends what the tool printed until `deadline`; false at its end of output (the
  // descriptor is closed there).
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    if (fd_ < 0) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) {
      close(std::exchange(fd_, -1));
      return false;
    }
    out_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
  bool catches_sigint() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    for (std::string l; std::getline(status, l);) {
      if (l.rfind("SigCgt:", 0) == 0) return (std::stoull(l.substr(7), nullptr, 16) & 0x2) != 0;
    }
    return false;
  }
  // Ends the tool and reaps it, its status in status_: given up to 10 s to exit by itself
  // once its output ended (it exits right after), else killed.
  void stop() {
    const bool ended = fd_ < 0;
    if (fd_ >= 0) close(std::exchange(fd_, -1));
    if (pid_ <= 0) return;
    for (int i = 0; ended && i < 1000; ++i) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(std::exchange(pid_, -1), &status_, 0);
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string out_;
  int status_ = -1;
  bool started_ = false;
};

}  // namespace ebpf_metricsd::test
