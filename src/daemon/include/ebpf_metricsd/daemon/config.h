#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ebpf_metricsd/base/config_error.h"
#include "ebpf_metricsd/core/tracer.h"
#include "ebpf_metricsd/http/web_settings.h"
#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/unwind_maps.h"

namespace ebpf_metricsd {

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
  // The nice value of the daemon's threads (-20 .. 19). Below the default 0: on a host whose
  // CPUs are all busy, the reads keep their pace instead of falling seconds behind, each then
  // holding seconds of stacks to name at once.
  int nice = -10;
  // Label sets per metric; 0 = unlimited.
  std::size_t max_series = 2000;
  // What the daemon keeps of the profile and the slow events for /profile and pprof: how
  // long, and at most how much (the oldest go first past either bound).
  struct Profiles {
    std::chrono::seconds retention = profiling::kDefaultRetention;
    std::size_t max_samples = profiling::ProfileStore::Limits{}.max_samples;
    std::size_t max_slow_events = profiling::SlowEventStore::Limits{}.max_events;
    // Rows of the unwind tables the kernel holds for every file walks meet (4 bytes each).
    std::uint32_t unwind_table_rows = profiling::UnwindMapLimits{}.rows;
  } profiles;
  // The kernel's BTF for kernels built without /sys/kernel/btf/vmlinux; "" = that file.
  std::string btf_path;
  // Every registered tracer, in registry order; those absent from the file are disabled.
  std::vector<TracerConfig> tracers;
};

// Parses and validates; throws ConfigError naming file:line:column and the key.
Config parse_config(const std::string& yaml_text, const std::string& file_name);
Config load_config(const std::string& path);

}  // namespace ebpf_metricsd
