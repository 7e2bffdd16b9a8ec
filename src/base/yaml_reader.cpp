#include "ebpf_metricsd/base/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace ebpf_metricsd {

namespace {

std::string location(const std::string& file, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

const char* kind_name(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "undefined";
  }
}

}  // namespace

YamlMapReader::YamlMapReader(const YAML::Node& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {
  if (!node_.IsNull() && !node_.IsMap()) {
    throw ConfigError(location(file_, node_) + ": " + (path_.empty() ? "<top level>" : path_) +
                      ": expected a mapping, got " + kind_name(node_));
  }
}

std::string YamlMapReader::key_path(const std::string& key) const {
  if (key.empty()) return path_.empty() ? "<top level>" : path_;
  const std::string shown = quoted_excerpt(key, 64, false);
  return path_.empty() ? shown : path_ + "." + shown;
}

void YamlMapReader::fail_at(const YAML::Node& node, const std::string& key,
                            const std::string& what) const {
  throw ConfigError(location(file_, node) + ": " + key_path(key) + ": " + what);
}

void YamlMapReader::fail(const std::string& key, const std::string& what) const {
  if (!key.empty() && has(key)) fail_at(node_[key], key, what);
  fail_at(node_, key, what);
}

void YamlMapReader::fail_key(const std::string& key, const std::string& what) const {
  if (node_.IsMap()) {
    for (const auto& kv : node_) {
      if (kv.first.IsScalar() && kv.first.Scalar() == key) fail_at(kv.first, key, what);
    }
  }
  fail(key, what);
}

bool YamlMapReader::has(const std::string& key) const {
  return node_.IsMap() && node_[key].IsDefined();
}

std::vector<std::string> YamlMapReader::keys() const {
  std::vector<std::string> out;
  if (!node_.IsMap()) return out;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) fail_at(kv.first, "", "keys must be scalars");
    out.push_back(kv.first.Scalar());
  }
  return out;
}

bool YamlMapReader::get_bool(const std::string& key, bool fallback) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const YAML::Node n = node_[key];
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  fail_at(n, key,
          std::string("expected true or false, got ") +
              (n.IsScalar() ? quoted_excerpt(n.Scalar()) : kind_name(n)));
}

std::string YamlMapReader::get_string(const std::string& key, const std::string& fallback) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const YAML::Node n = node_[key];
  if (!n.IsScalar()) fail_at(n, key, std::string("expected a string, got ") + kind_name(n));
  return n.Scalar();
}

std::int64_t YamlMapReader::get_int(const std::string& key, std::int64_t fallback, std::int64_t min,
                                    std::int64_t max) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const YAML::Node n = node_[key];
  if (!n.IsScalar()) fail_at(n, key, std::string("expected an integer, got ") + kind_name(n));
  const std::string& s = n.Scalar();
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    fail_at(n, key, "expected an integer, got " + quoted_excerpt(s));
  if (v < min || v > max) {
    fail_at(n, key,
            "value " + quoted_excerpt(s, 48, false) + " is out of range [" + std::to_string(min) +
                ", " + std::to_string(max) + "]");
  }
  return v;
}

std::chrono::milliseconds YamlMapReader::get_duration(const std::string& key,
                                                      std::chrono::milliseconds fallback,
                                                      std::chrono::milliseconds min,
                                                      std::chrono::milliseconds max) {
  known_.insert(key);
  if (!has(key)) return fallback;
  const YAML::Node n = node_[key];
  if (!n.IsScalar()) fail_at(n, key, std::string("expected a duration, got ") + kind_name(n));
  std::chrono::milliseconds d{};
  try {
    d = parse_duration(n.Scalar());
  } catch (const std::invalid_argument& e) {
    fail_at(n, key, e.what());
  }
  if (d < min || d > max) {
    fail_at(n, key,
            "duration " + quoted_excerpt(n.Scalar(), 48, false) + " is out of range [" +
                format_duration(min) + ", " + format_duration(max) + "]");
  }
  return d;
}

std::vector<std::string> YamlMapReader::get_string_list(const std::string& key) {
  known_.insert(key);
  std::vector<std::string> out;
  if (!has(key) || node_[key].IsNull()) return out;
  const YAML::Node n = node_[key];
  if (!n.IsSequence()) fail_at(n, key, std::string("expected a list, got ") + kind_name(n));
  for (const auto& item : n) {
    if (!item.IsScalar()) {
      fail_at(item, key, std::string("list items must be strings, got ") + kind_name(item));
    }
    out.push_back(item.Scalar());
  }
  return out;
}

YamlMapReader YamlMapReader::get_map(const std::string& key) {
  known_.insert(key);
  YAML::Node n = has(key) ? node_[key] : YAML::Node(YAML::NodeType::Null);
  return YamlMapReader(n, file_, key_path(key));
}

void YamlMapReader::finish() const {
  if (!node_.IsMap()) return;
  for (const auto& kv : node_) {
    const std::string k = kv.first.Scalar();
    if (!known_.count(k)) fail_key(k, "unknown key");
  }
}

std::chrono::milliseconds parse_duration(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty duration");
  struct Unit {
    const char* suffix;
    std::int64_t ms;
  };
  // Longest suffix first so "ms" is not read as "m".
  static const Unit units[] = {
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
  std::int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      throw std::invalid_argument("invalid duration " + quoted_excerpt(text) +
                                  " (expected e.g. 500ms, 5s, 1m, 1h30m)");
    }
    std::int64_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (n > std::numeric_limits<std::int64_t>::max() / 10 / 86'400'000) {
        throw std::invalid_argument("duration " + quoted_excerpt(text) + " is too large");
      }
      n = n * 10 + (text[i] - '0');
      ++i;
    }
    const Unit* unit = nullptr;
    for (const auto& u : units) {
      const std::string suffix = u.suffix;
      if (text.compare(i, suffix.size(), suffix) == 0) {
        unit = &u;
        i += suffix.size();
        break;
      }
    }
    if (!unit) {
      throw std::invalid_argument("invalid duration " + quoted_excerpt(text) +
                                  " (expected a unit: ms, s, m, h, d)");
    }
    if (n > (std::numeric_limits<std::int64_t>::max() - total) / unit->ms) {
      throw std::invalid_argument("duration " + quoted_excerpt(text) + " is too large");
    }
    total += n * unit->ms;
  }
  return std::chrono::milliseconds(total);
}

std::string format_duration(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms % 1000 != 0) return std::to_string(ms) + "ms";
  if (ms % 3'600'000 == 0 && ms != 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0 && ms != 0) return std::to_string(ms / 60'000) + "m";
  return std::to_string(ms / 1000) + "s";
}

namespace {

// A key that stands twice in one mapping: yaml-cpp keeps both and `node[key]` finds the first,
// so the second would be ignored without a word.
void reject_duplicate_keys(const YAML::Node& node, const std::string& file_name,
                           const std::string& path, int depth) {
  if (depth > kMaxConfigDepth) {
    throw ConfigError(location(file_name, node) + ": " + (path.empty() ? "<top level>" : path) +
                      ": nesting deeper than " + std::to_string(kMaxConfigDepth) + " levels");
  }
  if (node.IsSequence()) {
    for (const auto& item : node) reject_duplicate_keys(item, file_name, path, depth + 1);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) continue;  // reported as "keys must be scalars" where read
    const std::string& key = kv.first.Scalar();
    std::string key_path = path;
    if (!key_path.empty()) key_path += '.';
    key_path += key;
    const auto [it, fresh] = seen.emplace(key, kv.first.Mark());
    if (!fresh) {
      throw ConfigError(location(file_name, kv.first) + ": " + key_path +
                        ": duplicate key (first at line " + std::to_string(it->second.line + 1) +
                        ")");
    }
    reject_duplicate_keys(kv.second, file_name, key_path, depth + 1);
  }
}

}  // namespace

namespace {

ConfigError yaml_error(const std::string& file_name, const YAML::Exception& e,
                       const std::string& what) {
  return ConfigError(file_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                     std::to_string(e.mark.column + 1) + ": " + what);
}

// Watches one document's parse events before any node is built, so that what a file can ask
// of the parser is bounded by its size: no anchors or aliases (an alias bomb of 1 KiB stands
// for 10^10 nodes; no setting needs one), at most kMaxConfigNodes nodes, at most
// kMaxConfigDepth levels. Keeps the dotted key path for its messages, and where the
// document's first content stands.
class EventGuard : public YAML::EventHandler {
 public:
  explicit EventGuard(const std::string& file) : file_(file) {}
  std::optional<YAML::Mark> first;

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    // A document of nothing (a trailing "---") is no content; an empty value or key is.
    if (frames_.empty()) {
      if (anchor != YAML::NullAnchor) node(m, anchor);
      return;
    }
    node(m, anchor);
    scalar_done("");
  }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override {
    refuse(m,
           "a YAML alias (*name); anchors and aliases are not accepted in this config "
           "(no setting needs them): write the value out");
  }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    node(m, anchor);
    scalar_done(value);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(m, anchor, false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(m, anchor, true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool map;
    bool expect_key = true;
    std::string key;  // the key whose value is being read (mappings)
  };

  // The dotted path of the value being read, its keys quoted as excerpts; at most about 300
  // bytes (the innermost keys kept).
  std::string path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (!f.map || f.expect_key) continue;
      out += (out.empty() ? "" : ".") + f.key;
    }
    if (out.size() > 300) out = "..." + out.substr(out.size() - 300);
    return out.empty() ? "<top level>" : out;
  }
  // A scalar (or empty node) ended: a key of the mapping it stands in, or a value.
  void scalar_done(const std::string& value) {
    if (!frames_.empty() && frames_.back().map && frames_.back().expect_key) {
      frames_.back().key = value.empty() ? "<empty key>" : quoted_excerpt(value, 64, false);
      frames_.back().expect_key = false;
      return;
    }
    value_done();
  }
  [[noreturn]] void refuse(const YAML::Mark& m, const std::string& what) const {
    throw ConfigError(file_ + ":" + std::to_string(m.line + 1) + ":" +
                      std::to_string(m.column + 1) + ": " + path() + ": " + what);
  }
  void node(const YAML::Mark& m, YAML::anchor_t anchor) {
    if (!first) first = m;
    if (anchor != YAML::NullAnchor) {
      refuse(m,
             "a YAML anchor (&name); anchors and aliases are not accepted in this config "
             "(no setting needs them): write the value out");
    }
    if (++nodes_ > kMaxConfigNodes) {
      refuse(m, "more than " + std::to_string(kMaxConfigNodes) +
                    " values in one file, the most a config file may have");
    }
  }
  void open(const YAML::Mark& m, YAML::anchor_t anchor, bool map) {
    node(m, anchor);
    if (frames_.size() >= static_cast<std::size_t>(kMaxConfigDepth)) {
      refuse(m, "nesting deeper than " + std::to_string(kMaxConfigDepth) + " levels");
    }
    frames_.push_back(Frame{map, true, {}});
  }
  void close() {
    frames_.pop_back();
    // A list or mapping that was itself a key ("? [a]: b"): its value comes next.
    if (!frames_.empty() && frames_.back().map && frames_.back().expect_key) {
      frames_.back().key = "<complex key>";
      frames_.back().expect_key = false;
      return;
    }
    value_done();
  }
  // A value ended: in a mapping, the next scalar is a key again.
  void value_done() {
    if (!frames_.empty() && frames_.back().map) frames_.back().expect_key = true;
  }

  const std::string& file_;
  std::vector<Frame> frames_;
  std::size_t nodes_ = 0;
};

}  // namespace

YAML::Node parse_yaml(const std::string& text, const std::string& file_name) {
  YAML::Node root;
  try {
    // The parse events first: a file that would cost more than its size suggests is refused
    // before a node is built. The parser is asked for two documents and no more (a second
    // would be ignored by Load; yaml-cpp's LoadAll can loop, allocating, on some malformed
    // input).
    std::istringstream in(text);
    YAML::Parser parser(in);
    EventGuard first(file_name), second(file_name);
    if (parser.HandleNextDocument(first) && parser.HandleNextDocument(second) && second.first) {
      throw ConfigError(file_name + ":" + std::to_string(second.first->line + 1) + ":" +
                        std::to_string(second.first->column + 1) +
                        ": a second YAML document; a config file holds one");
    }
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw yaml_error(file_name, e, "nesting too deep");
  } catch (const YAML::Exception& e) {
    throw yaml_error(file_name, e, "invalid YAML: " + quoted_excerpt(e.msg, 200, false));
  }
  reject_duplicate_keys(root, file_name, "", 0);
  return root;
}

std::string quoted_excerpt(std::string_view value, std::size_t max_bytes, bool quotes) {
  std::string out;
  std::size_t end = std::min(value.size(), max_bytes);
  // Cut at a character boundary: never in the middle of a UTF-8 sequence.
  if (end < value.size()) {
    while (end > 0 && (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) --end;
  }
  for (std::size_t i = 0; i < end; ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7F) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (quotes) out = "'" + out + "'";
  if (end < value.size()) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  // ENOENT, ELOOP (a symlink loop), EACCES...: the system's own words.
  if (ec) throw ConfigError(path + ": " + ec.message());
  if (!std::filesystem::is_regular_file(status)) throw ConfigError(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read file: " + std::strerror(errno));
  // Read at most one byte past the limit: a huge file is refused before it costs memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw ConfigError(path + ": error reading file");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(path + ": larger than " + std::to_string(kMaxConfigBytes / 1024) +
                      " KiB, the most a config file may have");
  }
  return text;
}

}  // namespace ebpf_metricsd
