#pragma once
// Text helpers the symbolizer's parts share.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace ebpf_metricsd::profiling::text {

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A file read whole ("" when it cannot be opened).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace ebpf_metricsd::profiling::text
