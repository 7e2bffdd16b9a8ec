#include "ebpf_metricsd/daemon/config.h"

#include <bpf/btf.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/tracers/registry.h"

namespace ebpf_metricsd {

using namespace std::chrono_literals;

Config parse_config(const std::string& yaml_text, const std::string& file_name) {
  const YAML::Node root = parse_yaml(yaml_text, file_name);
  Config cfg;
  cfg.file = file_name;
  YamlMapReader top(root, file_name, "");

  YamlMapReader web = top.get_map("web");
  WebSettings& w = cfg.web;
  w.listen_address = web.get_string("listen_address", w.listen_address);
  if (auto err = validate_listen_address(w.listen_address); !err.empty()) {
    web.fail("listen_address", err);
  }
  auto count = [&web](const char* key, std::size_t fallback, std::int64_t max) {
    return static_cast<std::size_t>(web.get_int(key, static_cast<std::int64_t>(fallback), 1, max));
  };
  w.max_requests = count("max_requests", w.max_requests, Config::kMaxRequests);
  w.max_connections = count("max_connections", w.max_connections, Config::kMaxConnections);
  w.max_connections_per_address =
      count("max_connections_per_address", w.max_connections_per_address, Config::kMaxConnections);
  if (w.max_connections_per_address > w.max_connections) {
    web.fail("max_connections_per_address",
             "is above max_connections (" + std::to_string(w.max_connections) + ")");
  }
  w.request_timeout = web.get_duration("request_timeout", w.request_timeout, 100ms, 5min);
  w.idle_timeout = web.get_duration("idle_timeout", w.idle_timeout, 100ms, 1h);
  web.finish();

  cfg.drain_interval = top.get_duration("drain_interval", cfg.drain_interval, 100ms, 1h);
  cfg.nice = static_cast<int>(top.get_int("nice", cfg.nice, -20, 19));
  cfg.max_series = static_cast<std::size_t>(
      top.get_int("max_series", static_cast<std::int64_t>(cfg.max_series), 0, 10'000'000));

  YamlMapReader profiles = top.get_map("profiles");
  Config::Profiles& kept = cfg.profiles;
  const auto retention = profiles.get_duration("retention", kept.retention, 1min, 1h);
  if (retention.count() % 1000 != 0) profiles.fail("retention", "is not a whole number of seconds");
  kept.retention = std::chrono::duration_cast<std::chrono::seconds>(retention);
  kept.max_samples = static_cast<std::size_t>(profiles.get_int(
      "max_samples", static_cast<std::int64_t>(kept.max_samples), 1000, 10'000'000));
  kept.max_slow_events = static_cast<std::size_t>(profiles.get_int(
      "max_slow_events", static_cast<std::int64_t>(kept.max_slow_events), 100, 1'000'000));
  kept.unwind_table_rows = static_cast<std::uint32_t>(
      profiles.get_int("unwind_table_rows", kept.unwind_table_rows, 65536, 64 * 1024 * 1024));
  profiles.finish();

  cfg.btf_path = top.get_string("btf_path", "");
  if (!cfg.btf_path.empty()) {
    if (cfg.btf_path.front() != '/') top.fail("btf_path", "must be an absolute path");
    std::unique_ptr<btf, void (*)(btf*)> parsed(btf__parse(cfg.btf_path.c_str(), nullptr),
                                                btf__free);
    if (!parsed) {
      top.fail("btf_path", "cannot read BTF from " + quoted_excerpt(cfg.btf_path, 200, false) +
                               ": " + std::strerror(errno));
    }
  }

  YamlMapReader tracers = top.get_map("tracers");
  for (const auto& name : tracers.keys()) {
    if (!find_tracer(name)) {
      std::string known;
      for (const auto& d : tracer_registry()) known += (known.empty() ? "" : ", ") + d.name;
      tracers.fail_key(name, "unknown tracer (known: " + known + ")");
    }
  }
  for (const auto& desc : tracer_registry()) {
    YamlMapReader t = tracers.get_map(desc.name);
    TracerConfig tc;
    tc.name = desc.name;
    tc.summary = desc.summary;
    tc.enabled = t.get_bool("enabled", false);
    const std::string hook = t.get_string("hook", "auto");
    const auto pref = parse_hook_preference(hook);
    if (!pref) t.fail("hook", "expected auto, tp_btf or raw_tp, got " + quoted_excerpt(hook));
    if (!desc.traits.single_hook.empty() && *pref != HookPreference::Auto) {
      t.fail("hook", desc.name + " has a single hook kind (" + desc.traits.single_hook +
                         "); only auto is accepted");
    }
    tc.hook = *pref;
    if (desc.traits.owner == EventOwner::None && t.has("cgroup"))
      t.fail("cgroup", desc.name + "'s events have no owner to label by cgroup");
    if (desc.traits.owner == EventOwner::Always && t.has("cgroup"))
      t.fail("cgroup", desc.name + " is always labelled by cgroup");
    tc.options = desc.parse_options(t);
    t.finish();
    if (tracers.node()[desc.name]) {
      YAML::Emitter out;
      out << tracers.node()[desc.name];
      tc.fingerprint = out.c_str();
    }
    // Every tracer's programs were relocated against the BTF: a new one restarts them all.
    tc.fingerprint += "\nbtf_path: " + cfg.btf_path;
    cfg.tracers.push_back(std::move(tc));
  }
  tracers.finish();
  top.finish();
  return cfg;
}

Config load_config(const std::string& path) { return parse_config(read_config_file(path), path); }

}  // namespace ebpf_metricsd
