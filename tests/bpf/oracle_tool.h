#pragma once
// A libbpf-tools program (runqlat, biolatency) run beside the tracer as an independent
// oracle over the same window: started before the workload, interrupted after it. Where it
// is not reliable (inside the kernel matrix's TCG guests it loses events), the
// exact oracles decide alone: tests that are nothing but such a comparison carry the tag
// [external], which the matrix leaves out, and optional second opinions ask
// external_oracles_wanted().

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace ebpf_metricsd::test {

// False where EBPF_METRICSD_NO_EXTERNAL_ORACLES is set (the kernel matrix's guests).
inline bool external_oracles_wanted() {
  return std::getenv("EBPF_METRICSD_NO_EXTERNAL_ORACLES") == nullptr;
}

class OracleTool {
 public:
  // Starts `command` (a tool that prints its histogram when interrupted) and returns once
  // it printed `banner` (it prints that once attached). Unless `required`, a tool that exits
  // without it is not a failure: started() says.
  OracleTool(const std::string& command, const std::string& banner, bool required = true) {
    int out[2];
    REQUIRE(pipe2(out, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      // Line-buffered, or the banner would sit in stdio's buffer until the tool exits.
      const std::string line = "exec stdbuf -oL " + command;
      execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    pipe_ = fdopen(out[0], "r");
    REQUIRE(pipe_ != nullptr);
    char text[512];
    while (fgets(text, sizeof text, pipe_)) {
      out_ += text;
      if (out_.find(banner) != std::string::npos) break;
    }
    started_ = out_.find(banner) != std::string::npos;
    if (required) REQUIRE_THAT(out_, Catch::Matchers::Contains(banner));
  }
  bool started() const { return started_; }
  const std::string& output() const { return out_; }
  ~OracleTool() {
    if (pipe_) {
      kill(pid_, SIGKILL);
      fclose(pipe_);
      waitpid(pid_, nullptr, 0);
    }
  }
  OracleTool(const OracleTool&) = delete;
  OracleTool& operator=(const OracleTool&) = delete;

  // Interrupts the tool, so that its window ends here however long the workload took (a
  // fixed interval may end before a slow machine's workload does), waits for it to print
  // its histogram and exit, and returns everything it printed.
  const std::string& finish() {
    kill(pid_, SIGINT);
    char text[512];
    while (fgets(text, sizeof text, pipe_)) out_ += text;
    fclose(pipe_);
    pipe_ = nullptr;
    REQUIRE(waitpid(pid_, &status_, 0) == pid_);
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
  pid_t pid_ = -1;
  FILE* pipe_ = nullptr;
  std::string out_;
  int status_ = -1;
  bool started_ = false;
};

}  // namespace ebpf_metricsd::test
