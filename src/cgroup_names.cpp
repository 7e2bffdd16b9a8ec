#include "ebpf_metricsd/cgroup_names.h"

#include <sys/stat.h>

#include <filesystem>

namespace ebpf_metricsd {

std::string CgroupNames::label_for_path(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string last = slash == std::string::npos ? path : path.substr(slash + 1);
  static const char* const unit_suffixes[] = {".service", ".scope", ".socket",
                                              ".mount",   ".swap",  ".slice"};
  for (const char* suffix : unit_suffixes) {
    const std::string s = suffix;
    if (last.size() > s.size() && last.compare(last.size() - s.size(), s.size(), s) == 0) {
      return last;
    }
  }
  return path.empty() ? "/" : path;
}

void CgroupNames::rescan() {
  names_.clear();
  namespace fs = std::filesystem;
  std::error_code ec;
  struct stat st {};
  // Strings are built by append, not `"/" + s`: GCC 12 at -O2 warns falsely (-Wrestrict) on
  // the inlined copy of that operator.
  if (::stat(root_.c_str(), &st) == 0) names_[st.st_ino].assign(1, '/');
  for (fs::recursive_directory_iterator
           it(root_, fs::directory_options::skip_permission_denied, ec),
       end;
       it != end; it.increment(ec)) {
    if (ec) break;
    if (!it->is_directory(ec)) continue;
    if (::stat(it->path().c_str(), &st) != 0) continue;
    std::string rel(1, '/');
    rel.append(fs::relative(it->path(), root_, ec).string());
    names_[st.st_ino] = label_for_path(rel);
  }
}

std::string CgroupNames::name(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = names_.find(id);
  if (it == names_.end()) {
    rescan();  // a new cgroup since the last scan
    it = names_.find(id);
    if (it == names_.end()) it = names_.emplace(id, "unknown").first;
  }
  return it->second;
}

}  // namespace ebpf_metricsd
