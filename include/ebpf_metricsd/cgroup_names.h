#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace ebpf_metricsd {

// Names cgroup v2 ids (the inode numbers the kernel reports) for the `cgroup` label: the
// systemd unit when the cgroup is one ("nginx.service"), else the path below the cgroup2
// mount ("/user.slice/x"). Unknown ids (a cgroup already removed) are "unknown".
class CgroupNames {
 public:
  explicit CgroupNames(std::string root = "/sys/fs/cgroup") : root_(std::move(root)) {}
  std::string name(std::uint64_t id);

  // The label for a cgroup path relative to the mount ("/system.slice/nginx.service").
  static std::string label_for_path(const std::string& path);

 private:
  void rescan();
  std::string root_;
  std::mutex mutex_;
  std::map<std::uint64_t, std::string> names_;
};

}  // namespace ebpf_metricsd
