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

// The exit status when the configuration is invalid at start (EX_CONFIG of sysexits.h): the
// systemd unit does not restart on it (RestartPreventExitStatus=), as a restart would only
// fail again. Every other unexpected exit is restarted.
constexpr int kExitConfigError = 78;

// The signals the daemon takes synchronously (SIGTERM, SIGINT: stop; SIGHUP: reload).
// main() blocks them before anything else, so that no thread, and no instant of start-up,
// gets their default action; SIGPIPE is ignored there too.
void block_daemon_signals();

// Runs until SIGTERM or SIGINT, reloading the configuration on SIGHUP; returns the process
// exit code.
int run_daemon(const DaemonOptions& options);

}  // namespace ebpf_metricsd
