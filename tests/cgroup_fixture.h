#pragma once
// A cgroup v2 directory made by a test, and processes born in it (clone3 with
// CLONE_INTO_CGROUP, Linux 5.7+), so that every event of theirs belongs to it from their
// first instruction on.

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "ebpf_metricsd/base/cgroup_names.h"

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
    open_dir();
  }
  // A child cgroup `name` of `parent`.
  TestCgroup(const TestCgroup& parent, const std::string& name) {
    mount_ = cgroup2_mount();
    label_ = parent.label_ + "/" + name;
    path_ = parent.path_ + "/" + name;
    if (mkdir(path_.c_str(), 0755) != 0) throw std::runtime_error("mkdir " + path_);
    open_dir();
  }
  ~TestCgroup() { remove(); }
  // Removes the directory now (its processes must have ended).
  void remove() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
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
    return wait_for(spawn(fn), usage);
  }

  // A child born in this cgroup blocks `n` times in read() on an empty pipe: this process
  // writes each byte only after the child acknowledged the previous one and has switched out
  // in the read (wait_blocked), so each read blocks at any machine speed; a sleep, whose
  // timer may fire before the task reaches the scheduler, guarantees nothing. Returns what
  // the kernel accounted to the child.
  //
  // The child's voluntary switch count is the kernel's bookkeeping, not the sched_switch
  // tracepoint: once in a few thousand reads it moves for a switch the tracepoint shows as
  // runnable. A test that must know the child blocked `n` times as a tracer sees it passes
  // `blocked_switch_outs` (SchedOracle's count at the same tracepoint): each write then also
  // waits for one more blocked switch-out since the previous write, so there are at least
  // `n`, each in its own window, and each one returned (the child acknowledged a later write).
  rusage run_blocking_reads(int n, const std::function<std::uint64_t()>& blocked_switch_outs = {}) {
    int data[2], ack[2];
    if (pipe2(data, O_CLOEXEC) != 0 || pipe2(ack, O_CLOEXEC) != 0)
      throw std::runtime_error("pipe2");
    // The child's voluntary switch count before each read, shared with this process.
    static_assert(std::atomic<long>::is_always_lock_free);  // so it works across processes
    void* shared = mmap(nullptr, sizeof(std::atomic<long>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) throw std::runtime_error("mmap");
    auto* before = new (shared) std::atomic<long>(-1);
    // Counted before the child exists: its first read may block before this process looks.
    std::uint64_t seen = blocked_switch_outs ? blocked_switch_outs() : 0;
    const pid_t pid = spawn([&] {
      close(data[1]);  // so that the test closing its end is an EOF here
      close(ack[0]);
      char c;
      for (int i = 0; i < n; ++i) {
        *before = voluntary_switches_of_this_thread();
        if (read(data[0], &c, 1) != 1 || write(ack[1], &c, 1) != 1)
          throw std::runtime_error("pipe");
      }
    });
    close(data[0]);
    close(ack[1]);
    const std::string status_file = "/proc/" + std::to_string(pid) + "/status";
    // A child that died early must not kill the test with SIGPIPE.
    const auto old_sigpipe = signal(SIGPIPE, SIG_IGN);
    std::string failed;  // what went wrong, empty while all goes well
    for (int i = 0; failed.empty() && i < n; ++i) {
      const std::string read_i = "read " + std::to_string(i + 1) + " of " + std::to_string(n);
      if (!wait_blocked(status_file, before)) {
        failed = "the child never slept in " + read_i;
      } else if (blocked_switch_outs && !wait_above(blocked_switch_outs, seen)) {
        failed = "no blocked switch-out before " + read_i + " (" + std::to_string(seen) +
                 " seen before the previous write)";
      } else {
        if (blocked_switch_outs) seen = blocked_switch_outs();  // the child's next block is later
        char c = 'x';
        if (write(data[1], &c, 1) != 1 || read(ack[0], &c, 1) != 1)
          failed = "the pipes broke at " + read_i;
      }
    }
    signal(SIGPIPE, old_sigpipe);
    if (!failed.empty()) kill(pid, SIGKILL);
    close(data[1]);
    close(ack[0]);
    munmap(shared, sizeof(std::atomic<long>));
    rusage ru{};
    const int status = wait_for(pid, &ru);
    if (failed.empty() && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
      failed = "the child failed";
    if (!failed.empty()) throw std::runtime_error("the blocking reads in " + path_ + ": " + failed);
    return ru;
  }
  // A child born in this cgroup that runs `fn` and exits (1 when it throws).
  pid_t spawn(const std::function<void()>& fn) {
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
    return static_cast<pid_t>(pid);
  }

  static int wait_for(pid_t pid, rusage* usage) {
    int status = 0;
    rusage ru{};
    if (wait4(pid, &status, 0, &ru) != pid) throw std::runtime_error("wait4");
    if (usage) *usage = ru;
    return status;
  }

  // The calling thread's voluntary context switches so far.
  static long voluntary_switches_of_this_thread() {
    rusage ru{};
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_nvcsw;
  }

  // Waits until the task whose /proc status file is `status_file` has switched out asleep:
  // its state is S and its voluntary switches have gone past `*before` (its count just before
  // it began to wait, -1 until it has set it). State S alone is not enough: a task shows S
  // from the moment it prepares to wait, before schedule() switches it out, and a wakeup in
  // that window means no switch at all. False after 600,000 looks (a minute or more), or when
  // the task has exited.
  static bool wait_blocked(const std::string& status_file, const std::atomic<long>* before) {
    for (int i = 0; i < 600000; ++i) {
      std::ifstream in(status_file);
      if (!in) return false;
      char state = '?';
      long switches = -1;
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("State:", 0) == 0) {
          const auto at = line.find_first_not_of(" \t", 6);
          if (at != std::string::npos) state = line[at];
        } else if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
          switches = std::stol(line.substr(24));
        }
      }
      if (state == 'Z' || state == 'X') return false;
      const long mark = *before;
      if (state == 'S' && mark >= 0 && switches > mark) return true;
      usleep(100);
    }
    return false;
  }

  // Waits until `count()` is above `floor`; false after 600,000 looks (a minute or more).
  static bool wait_above(const std::function<std::uint64_t()>& count, std::uint64_t floor) {
    for (int i = 0; i < 600000; ++i) {
      if (count() > floor) return true;
      usleep(100);
    }
    return false;
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
  void open_dir() {
    fd_ = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || fstat(fd_, &st) != 0) throw std::runtime_error("open " + path_);
    id_ = st.st_ino;
  }
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

// A memory limit on a TestCgroup's processes: the v2 memory controller where the v2
// hierarchy has it, else the v1 memory controller (hybrid hosts, where v1 holds every
// controller), with the controller's own count of OOM kills as the oracle.
class MemoryLimit {
 public:
  static constexpr long kBytes = 64L << 20;

  explicit MemoryLimit(const TestCgroup& cg) {
    const std::string v2_root = cgroup2_mount();
    if (read(v2_root + "/cgroup.controllers").find("memory") != std::string::npos) {
      write(v2_root + "/cgroup.subtree_control", "+memory");
      events_ = cg.path() + "/memory.events";  // its child cgroups' kills too
      if (!write(cg.path() + "/memory.max", std::to_string(kBytes)))
        throw std::runtime_error("cannot set memory.max of " + cg.path());
      write(cg.path() + "/memory.swap.max", "0");  // absent without swap accounting
    } else {
      v1_ = "/sys/fs/cgroup/memory/emd-oom-" + std::to_string(getpid());
      rmdir(v1_.c_str());
      if (mkdir(v1_.c_str(), 0755) != 0 ||
          !write(v1_ + "/memory.limit_in_bytes", std::to_string(kBytes))) {
        throw std::runtime_error("cannot make the v1 memory cgroup " + v1_);
      }
      write(v1_ + "/memory.memsw.limit_in_bytes", std::to_string(kBytes));  // swap too
      events_ = v1_ + "/memory.oom_control";
    }
  }
  ~MemoryLimit() {
    if (!v1_.empty()) rmdir(v1_.c_str());
  }
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;

  // In the child: join the v1 cgroup (under v2 it was born inside the limit).
  void enter() const {
    if (!v1_.empty() && !write(v1_ + "/cgroup.procs", "0")) throw std::runtime_error("join " + v1_);
  }
  // The controller's oom_kill count (memory.events, or v1's memory.oom_control).
  std::uint64_t kills() const {
    std::istringstream in(read(events_));
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
      if (key == "oom_kill") return value;
    }
    throw std::runtime_error("no oom_kill in " + events_);
  }
  std::string where() const { return v1_.empty() ? "cgroup v2 memory.max" : "cgroup v1 " + v1_; }

 private:
  static bool write(const std::string& path, const std::string& value) {
    std::ofstream out(path);
    out << value;
    out.flush();
    return static_cast<bool>(out);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string v1_, events_;
};

// Touches anonymous memory page by page far past MemoryLimit::kBytes: the OOM killer ends
// the calling process (there is no swap for it).
inline void exceed_memory_limit() {
  const std::size_t len = static_cast<std::size_t>(MemoryLimit::kBytes) * 8;
  auto* p = static_cast<char*>(
      mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) throw std::runtime_error("mmap");
  madvise(p, len, MADV_NOHUGEPAGE);
  for (std::size_t off = 0; off < len; off += 4096) p[off] = 1;
}

}  // namespace ebpf_metricsd::test
