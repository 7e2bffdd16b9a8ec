#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ebpf_metricsd/config_error.h"
#include "ebpf_metricsd/hook_probe.h"
#include "ebpf_metricsd/http/web_settings.h"
#include "ebpf_metricsd/tracer.h"

namespace ebpf_metricsd {

struct TracerConfig {
  std::string name;
  bool enabled = false;
  HookPreference hook = HookPreference::Auto;
  std::shared_ptr<const TracerOptions> options;  // parsed by the tracer's descriptor
  // In a group (TracerDescriptor::group): the options of its enabled members, this one's too.
  TracerPeers peers;
  // The tracer's section as written (canonical YAML), and in a group every member's: a
  // reload restarts the tracer only when this changed.
  std::string fingerprint;
};

struct Config {
  std::string file;
  // Where and how /metrics is served; its `security` comes from --web.config.file.
  WebSettings web;
  // Ceilings that keep the web server within the systemd unit's limits: max_requests
  // (scrapes rendered at once), and max_connections, each holding a file descriptor under
  // LimitNOFILE=65536 beside the tracers' own.
  static constexpr std::int64_t kMaxRequests = 200;
  static constexpr std::int64_t kMaxConnections = 60000;
  std::chrono::milliseconds drain_interval{5000};
  // Label sets per metric; 0 = unlimited.
  std::size_t max_series = 2000;
  // The kernel's BTF for kernels built without /sys/kernel/btf/vmlinux; "" = that file.
  std::string btf_path;
  // Every registered tracer, in registry order; those absent from the file are disabled.
  std::vector<TracerConfig> tracers;
};

// Parses and validates; throws ConfigError naming file:line:column and the key.
Config parse_config(const std::string& yaml_text, const std::string& file_name);
Config load_config(const std::string& path);

}  // namespace ebpf_metricsd
