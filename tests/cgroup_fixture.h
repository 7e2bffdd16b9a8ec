#pragma once
// A cgroup v2 directory made by a test, and processes born in it (clone3 with
// CLONE_INTO_CGROUP, Linux 5.7+), so that every event of theirs belongs to it from their
// first instruction on.

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "ebpf_metricsd/cgroup_names.h"

namespace ebpf_metricsd::test {

class TestCgroup {
 public:
  // Makes <cgroup2 mount>/emd-<tag>-<pid>, removing what dead runs left.
  explicit TestCgroup(const std::string& tag) {
    mount_ = cgroup2_mount();
    if (mount_.empty()) throw std::runtime_error("no cgroup v2 hierarchy is mounted");
    remove_dead(tag);
    label_ = "/emd-" + tag + "-" + std::to_string(getpid());
    path_ = mount_ + label_;
    std::filesystem::remove(path_);
    if (mkdir(path_.c_str(), 0755) != 0) throw std::runtime_error("mkdir " + path_);
    fd_ = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || fstat(fd_, &st) != 0) throw std::runtime_error("open " + path_);
    id_ = st.st_ino;
  }
  ~TestCgroup() {
    close(fd_);
    rmdir(path_.c_str());
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  // The `cgroup` label the daemon gives it (a path below the mount, not a unit).
  const std::string& label() const { return label_; }
  const std::string& path() const { return path_; }
  std::uint64_t id() const { return id_; }

  // Runs `fn` in a child process born in this cgroup and waits for it; returns its wait
  // status and, in `usage`, what the kernel accounted to it (faults, ...).
  int run_status(const std::function<void()>& fn, rusage* usage = nullptr) {
    clone_args args{};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<std::uint64_t>(fd_);
    const long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0) throw std::runtime_error("clone3 into " + path_);
    if (pid == 0) {
      try {
        fn();
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    rusage ru{};
    if (wait4(static_cast<pid_t>(pid), &status, 0, &ru) != pid)
      throw std::runtime_error("wait4");
    if (usage) *usage = ru;
    return status;
  }
  // run_status() of a child that must exit with 0.
  rusage run(const std::function<void()>& fn) {
    rusage ru{};
    const int status = run_status(fn, &ru);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error("the workload in " + path_ + " failed");
    return ru;
  }

 private:
  void remove_dead(const std::string& tag) {
    const std::string prefix = "emd-" + tag + "-";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(mount_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string pid = name.substr(prefix.size());
      if (access(("/proc/" + pid).c_str(), F_OK) != 0) rmdir(e.path().c_str());
    }
  }
  std::string mount_, label_, path_;
  int fd_ = -1;
  std::uint64_t id_ = 0;
};

}  // namespace ebpf_metricsd::test
