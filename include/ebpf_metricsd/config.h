#pragma once

#include <any>
#include <chrono>
#include <string>
#include <vector>

#include "ebpf_metricsd/config_error.h"
#include "ebpf_metricsd/hook_probe.h"

namespace ebpf_metricsd {

struct TracerConfig {
  std::string name;
  bool enabled = false;
  HookPreference hook = HookPreference::Auto;
  std::any options;  // parsed by the tracer's descriptor
};

struct Config {
  std::string file;
  std::string listen_address = ":9810";
  std::chrono::milliseconds drain_interval{5000};
  // Every registered tracer, in registry order; those absent from the file are disabled.
  std::vector<TracerConfig> tracers;
};

// Parses and validates; throws ConfigError naming file:line:column and the key.
Config parse_config(const std::string& yaml_text, const std::string& file_name);
Config load_config(const std::string& path);

}  // namespace ebpf_metricsd
