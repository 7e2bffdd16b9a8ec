#include "ebpf_metricsd/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/web.h"
#include "ebpf_metricsd/yaml_reader.h"

namespace ebpf_metricsd {

using namespace std::chrono_literals;

Config parse_config(const std::string& yaml_text, const std::string& file_name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(file_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": invalid YAML: " + e.msg);
  }
  Config cfg;
  cfg.file = file_name;
  YamlMapReader top(root, file_name, "");

  YamlMapReader web = top.get_map("web");
  cfg.listen_address = web.get_string("listen_address", cfg.listen_address);
  if (auto err = validate_listen_address(cfg.listen_address); !err.empty()) {
    web.fail("listen_address", err);
  }
  web.finish();

  cfg.drain_interval = top.get_duration("drain_interval", cfg.drain_interval, 100ms, 1h);

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
    tc.enabled = t.get_bool("enabled", false);
    const std::string hook = t.get_string("hook", "auto");
    const auto pref = parse_hook_preference(hook);
    if (!pref) t.fail("hook", "expected auto, tp_btf or raw_tp, got '" + hook + "'");
    if (!desc.single_hook.empty() && *pref != HookPreference::Auto) {
      t.fail("hook", desc.name + " has a single hook kind (" + desc.single_hook +
                         "); only auto is accepted");
    }
    tc.hook = *pref;
    tc.options = desc.parse_options(t);
    t.finish();
    cfg.tracers.push_back(std::move(tc));
  }
  tracers.finish();
  top.finish();
  return cfg;
}

Config load_config(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw ConfigError(path + ": " +
                      (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
  }
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read config file");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": error reading config file");
  return parse_config(ss.str(), path);
}

}  // namespace ebpf_metricsd
