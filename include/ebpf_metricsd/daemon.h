#pragma once

#include <optional>
#include <string>

namespace ebpf_metricsd {

struct DaemonOptions {
  std::string config_path = "/etc/ebpf-metricsd/config.yaml";
  std::optional<std::string> listen_address;  // overrides the config file
  std::string web_config_path;                // --web.config.file: TLS and basic auth
  bool strict = false;                        // a tracer that fails to start is fatal
};

// Runs until SIGTERM or SIGINT, reloading the configuration on SIGHUP; returns the process
// exit code.
int run_daemon(const DaemonOptions& options);

}  // namespace ebpf_metricsd
