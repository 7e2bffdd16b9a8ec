#pragma once
// A libbpf-tools program (runqlat, biolatency) run beside the tracer as an independent
// oracle over the same window. Where it is not reliable (inside the kernel matrix's TCG
// guests it loses events and its fixed interval may not enclose a slow workload), the
// exact oracles decide alone: tests that are nothing but such a comparison carry the tag
// [external], which the matrix leaves out, and optional second opinions ask
// external_oracles_wanted().

#include <catch2/catch.hpp>
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
  // Starts `command` and returns once it printed `banner` (it prints that once attached).
  // Unless `required`, a tool that exits without it is not a failure: started() says.
  OracleTool(const std::string& command, const std::string& banner, bool required = true) {
    // Line-buffered, or the banner would sit in stdio's buffer until the tool exits.
    pipe_ = popen(("stdbuf -oL " + command + " 2>&1").c_str(), "r");
    REQUIRE(pipe_ != nullptr);
    char line[512];
    while (fgets(line, sizeof line, pipe_)) {
      out_ += line;
      if (out_.find(banner) != std::string::npos) break;
    }
    started_ = out_.find(banner) != std::string::npos;
    if (required) REQUIRE_THAT(out_, Catch::Matchers::Contains(banner));
  }
  bool started() const { return started_; }
  const std::string& output() const { return out_; }
  ~OracleTool() {
    if (pipe_) pclose(pipe_);
  }
  OracleTool(const OracleTool&) = delete;
  OracleTool& operator=(const OracleTool&) = delete;

  // Waits for the tool to end its interval and exit; returns everything it printed.
  const std::string& finish() {
    char line[512];
    while (fgets(line, sizeof line, pipe_)) out_ += line;
    status_ = pclose(pipe_);
    pipe_ = nullptr;
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
  FILE* pipe_ = nullptr;
  std::string out_;
  int status_ = -1;
  bool started_ = false;
};

}  // namespace ebpf_metricsd::test
