#pragma once
// The kernel's own counters, as oracles: /proc/vmstat, /proc/stat, /proc/net/snmp and
// /proc/softirqs.

#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
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

// A field of /proc/net/snmp, where each protocol has a header line of names and a line of
// values: snmp_counter("Tcp", "ActiveOpens").
inline std::uint64_t snmp_counter(const std::string& proto, const std::string& field) {
  std::ifstream in("/proc/net/snmp");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.compare(0, proto.size() + 1, proto + ":") != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value) {
      if (name == field) return std::stoull(value);
    }
  }
  throw std::runtime_error("no " + proto + " " + field + " in /proc/net/snmp");
}

// /proc/softirqs: each vector's handler runs, summed over the CPUs, by the vector's name in
// lower case ("net_rx").
inline std::map<std::string, std::uint64_t> softirq_counts() {
  std::ifstream in("/proc/softirqs");
  std::string line;
  std::getline(in, line);  // the CPUs
  std::map<std::string, std::uint64_t> counts;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    if (!(ls >> name) || name.empty() || name.back() != ':') continue;
    name.pop_back();
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::uint64_t n = 0, sum = 0;
    while (ls >> n) sum += n;
    counts[name] = sum;
  }
  return counts;
}

}  // namespace ebpf_metricsd::test
