// The workload label decoders, on the cgroup paths systemd, kubelet (both drivers) and the
// container runtimes make, and CgroupNames on a cgroup tree of plain directories.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "ebpf_metricsd/base/cgroup_names.h"

using namespace ebpf_metricsd;

namespace {
const std::string kUid = "1a2b3c4d-5e6f-4a1b-8c2d-0123456789ab";
const std::string kUidUnderscores = "1a2b3c4d_5e6f_4a1b_8c2d_0123456789ab";
const std::string kId = "4f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
}  // namespace

TEST_CASE("systemd units and plain paths") {
  CHECK(cgroup_unit_or_path("/system.slice/nginx.service") == "nginx.service");
  CHECK(cgroup_unit_or_path("/user.slice/user-1000.slice/session-3.scope") == "session-3.scope");
  CHECK(cgroup_unit_or_path("/system.slice") == "system.slice");
  CHECK(cgroup_unit_or_path("/batch/job-17") == "/batch/job-17");
  CHECK(cgroup_unit_or_path("/x/.service") == "/x/.service");  // a suffix alone is no unit
  CHECK(cgroup_unit_or_path("") == "/");
  const CgroupLabel l = cgroup_label_for_path("/system.slice/nginx.service");
  CHECK(l.cgroup == "nginx.service");
  CHECK(l.pod.empty());
  CHECK(l.container.empty());
}

TEST_CASE("Kubernetes pods and containers, systemd driver") {
  for (const std::string qos : {"", "burstable-", "besteffort-"}) {
    const std::string slice =
        qos.empty() ? "" : "/kubepods-" + qos.substr(0, qos.size() - 1) + ".slice";
    const std::string pod =
        "/kubepods.slice" + slice + "/kubepods-" + qos + "pod" + kUidUnderscores + ".slice";
    INFO(pod);
    CHECK(kubernetes_pod_uid(pod) == kUid);
    CHECK(kubernetes_container_id(pod).empty());  // the pod itself has no container
    for (const std::string runtime : {"cri-containerd-", "crio-", "docker-"}) {
      const std::string c = pod + "/" + runtime + kId + ".scope";
      INFO(c);
      const CgroupLabel l = cgroup_label_for_path(c);
      CHECK(l.pod == kUid);
      CHECK(l.container == kId);
      CHECK(l.cgroup == runtime + kId + ".scope");
    }
    // CRI-O's monitor process runs beside the container: it is no container.
    CHECK(kubernetes_container_id(pod + "/crio-conmon-" + kId + ".scope").empty());
    CHECK(kubernetes_pod_uid(pod + "/crio-conmon-" + kId + ".scope") == kUid);
  }
}

TEST_CASE("Kubernetes pods and containers, cgroupfs driver") {
  for (const std::string qos : {"", "/burstable", "/besteffort"}) {
    const std::string pod = "/kubepods" + qos + "/pod" + kUid;
    INFO(pod);
    CHECK(kubernetes_pod_uid(pod) == kUid);
    CHECK(kubernetes_container_id(pod).empty());
    CHECK(kubernetes_container_id(pod + "/" + kId) == kId);
    CHECK(kubernetes_container_id(pod + "/crio-" + kId) == kId);
    CHECK(cgroup_label_for_path(pod + "/" + kId).cgroup == pod + "/" + kId);
  }
}

TEST_CASE("paths that only look like Kubernetes are not decoded") {
  // No kubepods above it.
  CHECK(kubernetes_pod_uid("/system.slice/pod" + kUid + ".slice").empty());
  // A uid one digit short, a non-hex digit, a wrong separator position.
  CHECK(kubernetes_pod_uid("/kubepods/pod" + kUid.substr(1)).empty());
  std::string bad = kUid;
  bad[0] = 'g';
  CHECK(kubernetes_pod_uid("/kubepods/pod" + bad).empty());
  bad = kUid;
  std::swap(bad[8], bad[9]);
  CHECK(kubernetes_pod_uid("/kubepods/pod" + bad).empty());
  // "xpod<uid>": the pod marker must stand at the start or after a dash.
  CHECK(kubernetes_pod_uid("/kubepods/xpod" + kUid).empty());
  // A container ID must be 64 lower-case hex digits, directly inside the pod.
  const std::string pod = "/kubepods/pod" + kUid;
  CHECK(kubernetes_container_id(pod + "/" + kId.substr(1)).empty());
  CHECK(kubernetes_container_id(pod + "/" + kId + "0").empty());
  std::string upper = kId;
  upper[0] = 'F';
  CHECK(kubernetes_container_id(pod + "/" + upper).empty());
  CHECK(kubernetes_container_id(pod + "/" + kId + "/sub").empty());
  CHECK(kubernetes_container_id("/system.slice/docker-" + kId + ".scope").empty());
}

TEST_CASE("CgroupNames names directories by inode, and knows when one is gone") {
  char tmpl[] = "/tmp/emd-cgroups-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::filesystem::path root(tmpl);
  const auto make = [&](const std::string& rel) {
    std::filesystem::create_directories(root / rel);
    struct stat st {};
    REQUIRE(::stat((root / rel).c_str(), &st) == 0);
    return static_cast<std::uint64_t>(st.st_ino);
  };
  const std::uint64_t nginx = make("system.slice/nginx.service");
  const std::uint64_t ctr = make("kubepods/burstable/pod" + kUid + "/" + kId);

  CgroupNames names(root.string());
  names.begin_pass();
  CHECK(names.label(0).cgroup == "none");
  CHECK(names.name(nginx) == "nginx.service");
  const CgroupLabel c = names.label(ctr);
  CHECK(c.pod == kUid);
  CHECK(c.container == kId);
  CHECK(names.scans() == 1);

  // A cgroup made after the scan: the next pass scans once and finds it; ids it does not
  // find are "unknown", without another scan in the same pass.
  const std::uint64_t later = make("batch/job-1");
  CHECK(names.name(later) == "unknown");  // same pass: no second scan
  CHECK(names.scans() == 1);
  names.begin_pass();
  CHECK(names.name(later) == "/batch/job-1");
  CHECK(names.scans() == 2);
  CHECK(names.name(987654321) == "unknown");
  CHECK(names.scans() == 2);

  CHECK_FALSE(names.gone(nginx));
  CHECK(names.gone(987654321));
  CHECK_FALSE(names.gone(0));

  // A cgroup named once keeps its name for its last events after it is removed, through
  // the next scan; the scan after that forgets it.
  std::filesystem::remove(root / "batch/job-1");
  names.begin_pass();
  CHECK(names.name(987654322) == "unknown");  // a scan without job-1
  CHECK(names.scans() == 3);
  CHECK(names.name(later) == "/batch/job-1");
  names.begin_pass();
  CHECK(names.name(987654323) == "unknown");  // a second scan without it
  CHECK(names.scans() == 4);
  CHECK(names.name(later) == "unknown");
  std::filesystem::remove_all(root);
}

TEST_CASE("the cgroup2 mount is found in mountinfo, unified or hybrid") {
  std::istringstream hybrid(
      "25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
      "28 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
      "29 28 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n"
      "30 28 0:28 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n");
  CHECK(cgroup2_mount(hybrid) == "/sys/fs/cgroup/unified");
  std::istringstream unified(
      "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n");
  CHECK(cgroup2_mount(unified) == "/sys/fs/cgroup");
  // Optional fields before the separator do not shift the mount point.
  std::istringstream optional("35 24 0:30 / /cg rw shared:9 master:3 - cgroup2 none rw\n");
  CHECK(cgroup2_mount(optional) == "/cg");
  std::istringstream none("28 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n");
  CHECK(cgroup2_mount(none).empty());
}
