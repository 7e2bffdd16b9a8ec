#pragma once

#include <optional>
#include <string>

namespace ebpf_metricsd {

struct DaemonOptions {
  std::string config_path = "/etc/ebpf-metricsd/config.yaml";
  std::optional<std::string> listen_address;  // overrides the config file
  bool strict = false;                        // a tracer that fails to start is fatal
};

// Runs until SIGTERM or SIGINT; returns the process exit code.
int run_daemon(const DaemonOptions& options);

}  // namespace ebpf_metricsd
