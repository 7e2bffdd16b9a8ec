#include "ebpf_metricsd/base/cgroup_names.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace ebpf_metricsd {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < path.size()) {
    const std::size_t j = std::min(path.find('/', i), path.size());
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// 8-4-4-4-12 hex digits, the groups separated by '-' (cgroupfs) or '_' (systemd, which
// reserves '-' for its slice hierarchy).
bool is_pod_uid(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool separator = i == 8 || i == 13 || i == 18 || i == 23;
    if (separator ? (s[i] != '-' && s[i] != '_') : !is_hex(s[i])) return false;
  }
  return true;
}

// "pod<uid>" or "kubepods[-<qos>]-pod<uid>.slice" -> the uid as written, or "".
std::string_view pod_uid_of(std::string_view component) {
  if (ends_with(component, ".slice")) component.remove_suffix(6);
  if (component.size() < 39) return {};
  const std::string_view uid = component.substr(component.size() - 36);
  const std::string_view before = component.substr(0, component.size() - 36);
  if (!ends_with(before, "pod") || !is_pod_uid(uid)) return {};
  if (before.size() > 3 && before[before.size() - 4] != '-') return {};
  return uid;
}

}  // namespace

std::string cgroup_unit_or_path(const std::string& path) {
  const auto slash = path.rfind('/');
  std::string last = slash == std::string::npos ? path : path.substr(slash + 1);
  static const char* const unit_suffixes[] = {".service", ".scope", ".socket",
                                              ".mount",   ".swap",  ".slice"};
  for (const char* suffix : unit_suffixes) {
    if (last.size() > std::string_view(suffix).size() && ends_with(last, suffix)) return last;
  }
  return path.empty() ? "/" : path;
}

std::string kubernetes_pod_uid(const std::string& path) {
  if (path.find("kubepods") == std::string::npos) return {};
  for (std::string_view c : components(path)) {
    const std::string_view uid = pod_uid_of(c);
    if (uid.empty()) continue;
    std::string out(uid);
    std::replace(out.begin(), out.end(), '_', '-');
    return out;
  }
  return {};
}

std::string kubernetes_container_id(const std::string& path) {
  const auto parts = components(path);
  if (parts.size() < 2 || pod_uid_of(parts[parts.size() - 2]).empty()) return {};
  std::string_view last = parts.back();
  if (ends_with(last, ".scope")) last.remove_suffix(6);
  if (starts_with(last, "crio-conmon-")) return {};
  for (std::string_view prefix : {"cri-containerd-", "crio-", "docker-"}) {
    if (starts_with(last, prefix)) {
      last.remove_prefix(prefix.size());
      break;
    }
  }
  if (last.size() != 64 || !std::all_of(last.begin(), last.end(), is_hex)) return {};
  return std::string(last);
}

CgroupLabel cgroup_label_for_path(const std::string& path) {
  return {cgroup_unit_or_path(path), kubernetes_pod_uid(path), kubernetes_container_id(path)};
}

std::string cgroup2_mount(std::istream& mountinfo) {
  std::string line;
  while (std::getline(mountinfo, line)) {
    // "id parent major:minor root mount-point options [optional...] - fstype source ..."
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string fstype;
    after >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream before(line.substr(0, dash));
    std::string field, mount_point;
    for (int i = 0; i < 5 && before >> field; ++i) mount_point = field;
    return mount_point;
  }
  return {};
}

std::string cgroup2_mount() {
  std::ifstream in("/proc/self/mountinfo");
  return cgroup2_mount(in);
}

void CgroupNames::begin_pass() {
  std::lock_guard lock(mutex_);
  pass_start_ = std::chrono::steady_clock::now();
}

void CgroupNames::rescan() {
  last_scan_ = std::chrono::steady_clock::now();
  scanned_ = true;
  ++scans_;
  paths_.clear();
  if (root_.empty()) return;  // no cgroup v2 hierarchy: every id is unknown
  namespace fs = std::filesystem;
  struct stat st {};
  if (::stat(root_.c_str(), &st) != 0) return;
  paths_[st.st_ino].clear();
  // Depth first, one directory at a time: a cgroup removed while it is walked (ENOENT)
  // costs only its own subtree, never the rest of the tree.
  std::vector<fs::path> todo{fs::path(root_)};
  while (!todo.empty()) {
    const fs::path dir = std::move(todo.back());
    todo.pop_back();
    std::error_code ec;
    for (fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (!it->is_directory(type_ec) || it->is_symlink(type_ec)) continue;
      if (::stat(it->path().c_str(), &st) != 0) continue;
      // Built by append, not `"/" + s`: GCC 12 at -O2 warns falsely (-Wrestrict) on the
      // inlined copy of that operator.
      std::string rel(1, '/');
      rel.append(it->path().string().substr(root_.size() + (root_.back() == '/' ? 0 : 1)));
      paths_[st.st_ino] = std::move(rel);
      todo.push_back(it->path());
    }
  }
  // Labels of cgroups that two scans did not find are dropped (ids are never reused).
  for (auto it = labels_.begin(); it != labels_.end();) {
    if (paths_.count(it->first)) it->second.seen = scans_;
    it = it->second.seen + 1 < scans_ ? labels_.erase(it) : std::next(it);
  }
}

const std::string* CgroupNames::find_path(std::uint64_t id) {
  auto it = paths_.find(id);
  if (it == paths_.end() && (!scanned_ || last_scan_ < pass_start_)) {
    rescan();  // a cgroup made since the last scan, or one that is gone
    it = paths_.find(id);
  }
  return it == paths_.end() ? nullptr : &it->second;
}

CgroupLabel CgroupNames::label(std::uint64_t id) {
  if (id == 0) return {"none", "", ""};
  std::lock_guard lock(mutex_);
  if (auto it = labels_.find(id); it != labels_.end()) return it->second.label;
  const std::string* path = find_path(id);
  if (!path) return {"unknown", "", ""};
  return labels_.emplace(id, Named{cgroup_label_for_path(*path), scans_}).first->second.label;
}

bool CgroupNames::gone(std::uint64_t id) {
  if (id == 0) return false;
  std::lock_guard lock(mutex_);
  // A scan at most this old decides: an id missing from it is gone (or made after it, which
  // costs only that its idle map entry is dropped and made again by its next event).
  constexpr auto kMaxAge = std::chrono::seconds(30);
  if (!scanned_ || std::chrono::steady_clock::now() - last_scan_ > kMaxAge) rescan();
  return !paths_.count(id);
}

}  // namespace ebpf_metricsd
