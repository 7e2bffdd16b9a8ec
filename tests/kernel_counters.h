#pragma once
// The kernel's own counters, as oracles: /proc/vmstat and /proc/stat.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ebpf_metricsd::test {

// A "name value" line of a /proc file (/proc/vmstat: "pgfault 123"; /proc/stat: "ctxt 456").
inline std::uint64_t proc_counter(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    std::uint64_t value = 0;
    if (ls >> key >> value && key == name) return value;
  }
  throw std::runtime_error("no " + name + " in " + file);
}

}  // namespace ebpf_metricsd::test
