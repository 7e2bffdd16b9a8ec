#pragma once

#include <stdexcept>
#include <string>

namespace ebpf_metricsd {

// A configuration problem, already formatted as "file:line:column: key: what is wrong".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ebpf_metricsd
