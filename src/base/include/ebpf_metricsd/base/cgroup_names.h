#pragma once
// The workload labels of a cgroup v2 id (the kernfs node id the kernel reports, the inode
// number of the cgroup's directory): `cgroup`, and `pod` / `container` under Kubernetes.

#include <chrono>
#include <cstdint>
#include <istream>
#include <map>
#include <mutex>
#include <string>

namespace ebpf_metricsd {

struct CgroupLabel {
  // The systemd unit when the cgroup is one ("nginx.service"), else the path below the
  // cgroup2 mount ("/user.slice/x"); "unknown" for a cgroup that is gone, "none" for id 0
  // (an event with no owning cgroup).
  std::string cgroup;
  // Kubernetes: the pod's UID (as kube_pod_info's `uid`) and the container's runtime ID (as
  // kube_pod_container_info's `container_id` after its "<runtime>://"); "" elsewhere.
  std::string pod;
  std::string container;
};

// Label decoders, each a pure function of the path below the mount.
// "/system.slice/nginx.service" -> "nginx.service"; "/a/b" -> "/a/b"; "" -> "/".
std::string cgroup_unit_or_path(const std::string& path);
// The pod UID of a kubelet pod cgroup or anything below it, with the systemd driver's
// underscores turned back into dashes ("kubepods-burstable-pod1a2b..._....slice", "pod1a2b-..."),
// or "".
std::string kubernetes_pod_uid(const std::string& path);
// The 64-hex container ID of a container cgroup inside a pod (containerd, CRI-O, Docker,
// with either driver), or "" (also for the pod cgroup itself and CRI-O's conmon).
std::string kubernetes_container_id(const std::string& path);
CgroupLabel cgroup_label_for_path(const std::string& path);

// Where the cgroup v2 hierarchy is mounted, from /proc/self/mountinfo lines: /sys/fs/cgroup
// on unified hosts, /sys/fs/cgroup/unified on hybrid ones (v1 controllers beside it); ""
// when there is none.
std::string cgroup2_mount(std::istream& mountinfo);
std::string cgroup2_mount();

class CgroupNames {
 public:
  // `root`: the cgroup2 mount (default: found in /proc/self/mountinfo).
  explicit CgroupNames(std::string root = cgroup2_mount()) : root_(std::move(root)) {}

  // Call before naming the ids of one drain: an id that a scan made after this call does
  // not find is gone. At most one scan per pass.
  void begin_pass();
  CgroupLabel label(std::uint64_t id);
  std::string name(std::uint64_t id) { return label(id).cgroup; }
  // Whether the cgroup no longer exists: not found by a scan at most 30 s old (scans when
  // the last one is older).
  bool gone(std::uint64_t id);
  // Directory walks made so far.
  std::uint64_t scans() const { return scans_; }

 private:
  // Finds id, scanning first if no scan was made in this pass. Caller holds mutex_.
  const std::string* find_path(std::uint64_t id);
  void rescan();
  std::string root_;
  std::mutex mutex_;
  std::map<std::uint64_t, std::string> paths_;  // id -> path below root_, from the last scan
  // Decoded on first use; kept until two scans in a row have not found the cgroup, so that
  // the last events of a cgroup removed since the scan still get its name.
  struct Named {
    CgroupLabel label;
    std::uint64_t seen;  // the last scan that found it
  };
  std::map<std::uint64_t, Named> labels_;
  std::chrono::steady_clock::time_point pass_start_{};
  std::chrono::steady_clock::time_point last_scan_{};
  bool scanned_ = false;
  std::uint64_t scans_ = 0;
};

}  // namespace ebpf_metricsd
