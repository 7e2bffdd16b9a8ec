#pragma once

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/base/config_error.h"

namespace ebpf_metricsd {

// Strict reader of one YAML mapping. Every getter records the key as known; finish()
// rejects any key nobody asked for. All errors name file:line:column and the full key path.
class YamlMapReader {
 public:
  // `node` must be a mapping (or null, read as empty); `path` is its dotted key path.
  YamlMapReader(const YAML::Node& node, std::string file, std::string path);

  bool has(const std::string& key) const;
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  std::int64_t get_int(const std::string& key, std::int64_t fallback, std::int64_t min,
                       std::int64_t max);
  // Prometheus-style duration: "250ms", "5s", "1m", "1h30m".
  std::chrono::milliseconds get_duration(const std::string& key, std::chrono::milliseconds fallback,
                                         std::chrono::milliseconds min,
                                         std::chrono::milliseconds max);
  std::vector<std::string> get_string_list(const std::string& key);
  // A nested mapping (null or absent reads as an empty mapping).
  YamlMapReader get_map(const std::string& key);
  // The keys present in this mapping, in file order.
  std::vector<std::string> keys() const;

  // Throws ConfigError for the first key that no getter asked for.
  void finish() const;

  // Error at this key (or at the mapping itself when key is empty).
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // Error pointing at the key itself rather than its value (for unknown names).
  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const;
  [[noreturn]] void fail_at(const YAML::Node& node, const std::string& key,
                            const std::string& what) const;

  const std::string& file() const { return file_; }
  const YAML::Node& node() const { return node_; }
  std::string key_path(const std::string& key) const;

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
  std::set<std::string> known_;
};

// A config file may be at most this large (the shipped one is about 6 KiB); a larger one
// is refused before it is read whole or parsed.
constexpr std::size_t kMaxConfigBytes = 256 * 1024;
// Mappings and lists may nest this deep; the config itself needs 4 levels.
constexpr int kMaxConfigDepth = 32;
// A config file may hold this many values (scalars, lists and mappings); the shipped one
// has about 300, a syscall list of every system call about 400 more.
constexpr std::size_t kMaxConfigNodes = 20000;

// Parses YAML text; a syntax error, a duplicate key, a second document, an anchor or alias,
// more than kMaxConfigNodes values or nesting deeper than kMaxConfigDepth throws ConfigError
// naming file:line:column. The work is bounded by the text's size: the parse events are
// checked before any node is built.
YAML::Node parse_yaml(const std::string& text, const std::string& file_name);

// A value as an error message quotes it: at most `max_bytes` of it, cut at a character
// boundary and followed by its length when cut, control characters escaped (\xNN), in single
// quotes unless `quotes` is false. A message stays short and one line whatever the file holds.
std::string quoted_excerpt(std::string_view value, std::size_t max_bytes = 48, bool quotes = true);
// The bytes of a configuration file; throws ConfigError naming it when it cannot be read.
std::string read_config_file(const std::string& path);

// Parses a Prometheus-style duration ("1h30m", "500ms"); throws std::invalid_argument.
std::chrono::milliseconds parse_duration(const std::string& text);
std::string format_duration(std::chrono::milliseconds d);

}  // namespace ebpf_metricsd
