#pragma once
// A known slow syscall for the slow-event tests: a child process reads from a pipe in
// slow_read_in_known_function, by that function's own syscall instruction (so the user stack
// taken at sys_exit begins there whatever the C library was built with). Each read is written
// to only once the child sleeps in it (TestCgroup::wait_blocked), and `delay` later: every
// read takes at least `delay`, at any machine speed. The child stays until the object goes,
// so that its mappings are there when its events are symbolized. Each read is also one
// off-CPU wait of at least `delay`, in the same function.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "cgroup_fixture.h"

namespace ebpf_metricsd::test {

__attribute__((noinline)) inline long slow_read_in_known_function(int fd, char* c) {
#if defined(__x86_64__)
  long ret;
  asm volatile("syscall"
               : "=a"(ret)
               : "0"(static_cast<long>(SYS_read)), "D"(static_cast<long>(fd)), "S"(c), "d"(1L)
               : "rcx", "r11", "memory");
  return ret;
#else
  return read(fd, c, 1);
#endif
}

// pwrite64 by this function's own syscall instruction.
__attribute__((noinline)) inline long write_in_known_function(int fd, const void* buf, long n,
                                                              long offset) {
#if defined(__x86_64__)
  long ret;
  register long r10 asm("r10") = offset;
  asm volatile("syscall"
               : "=a"(ret)
               : "0"(static_cast<long>(SYS_pwrite64)), "D"(static_cast<long>(fd)), "S"(buf), "d"(n),
                 "r"(r10)
               : "rcx", "r11", "memory");
  return ret;
#else
  return pwrite(fd, buf, n, offset);
#endif
}

// connect() by this function's own syscall instruction.
__attribute__((noinline)) inline long connect_in_known_function(int fd, const void* addr,
                                                                long len) {
#if defined(__x86_64__)
  long ret;
  asm volatile("syscall"
               : "=a"(ret)
               : "0"(static_cast<long>(SYS_connect)), "D"(static_cast<long>(fd)), "S"(addr),
                 "d"(len)
               : "rcx", "r11", "memory");
  return ret;
#else
  return connect(fd, static_cast<const sockaddr*>(addr), static_cast<socklen_t>(len));
#endif
}

// A forked child that, its work done, stays until finish(), so that its mappings are there
// when its events are symbolized.
class HeldChild {
 public:
  pid_t pid() const { return pid_; }
  // Lets the child exit and returns its exit status (0: its work succeeded).
  int finish() {
    if (pid_ <= 0) return status_;
    if (write(go_[1], "x", 1) != 1) kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -pid_;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    return status_;
  }
  HeldChild(const HeldChild&) = delete;
  HeldChild& operator=(const HeldChild&) = delete;

 protected:
  HeldChild() {
    if (pipe(go_) != 0) throw std::runtime_error("pipe");
  }
  ~HeldChild() {
    finish();
    close(go_[0]);
    close(go_[1]);
  }
  // Forks a child that runs `work` (true: it succeeded) and then waits for finish().
  void fork_child(const std::function<bool()>& work) {
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      const bool ok = work();
      char c;
      _exit(ok && read(go_[0], &c, 1) == 1 ? 0 : 1);
    }
  }

 private:
  int go_[2]{-1, -1};
  pid_t pid_ = 0;
  int status_ = 0;
};

// A child that blocks `reads` times in slow_read_in_known_function's read of a pipe, each time
// for at least `delay` (the write comes only once it is seen blocked).
class SlowReader : public HeldChild {
 public:
  static constexpr const char* kComm = "emd-slowreader";
  SlowReader(int reads, std::chrono::milliseconds delay) {
    if (pipe(data_) != 0 || pipe(done_) != 0) throw std::runtime_error("pipe");
    void* shared = mmap(nullptr, sizeof(std::atomic<long>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) throw std::runtime_error("mmap");
    before_ = new (shared) std::atomic<long>(-1);
    fork_child([&] {
      // A name of its own: the series of comm-labelled histograms it lands in are its alone.
      prctl(PR_SET_NAME, kComm);
      char c;
      for (int i = 0; i < reads; ++i) {
        *before_ = TestCgroup::voluntary_switches_of_this_thread();
        if (slow_read_in_known_function(data_[0], &c) != 1 || write(done_[1], &c, 1) != 1)
          return false;
      }
      return true;
    });
    const std::string status = "/proc/" + std::to_string(pid()) + "/status";
    const std::string syscall = "/proc/" + std::to_string(pid()) + "/syscall";
    for (int i = 0; i < reads; ++i) {
      if (!TestCgroup::wait_blocked(status, before_)) throw std::runtime_error("reader gone");
      // Blocked in the read itself (system call 0), not in a sleep on its way there (a page
      // fault): its wait began before the delay does, so it lasts at least the delay.
      if (!in_read(syscall)) throw std::runtime_error("reader not blocked in read");
      std::this_thread::sleep_for(delay);
      *before_ = -1;
      char c = 'x';
      if (write(data_[1], &c, 1) != 1 || read(done_[0], &c, 1) != 1) {
        throw std::runtime_error("reader pipe");
      }
    }
  }
  ~SlowReader() {
    finish();
    for (int fd : {data_[0], data_[1], done_[0], done_[1]}) close(fd);
    munmap(before_, sizeof(std::atomic<long>));
  }

 private:
  // Waits until the child is blocked in read(2) (its /proc syscall file names system call 0;
  // a running task's says "running"); false after a minute.
  static bool in_read(const std::string& syscall) {
    for (int i = 0; i < 600000; ++i) {
      std::ifstream in(syscall);
      std::string line;
      if (!in || !std::getline(in, line)) return false;
      if (line.rfind("0 ", 0) == 0) return true;
      usleep(100);
    }
    return false;
  }
  int data_[2]{-1, -1}, done_[2]{-1, -1};
  std::atomic<long>* before_ = nullptr;
};

// A child process that writes `n` 4 KiB blocks to the block device `dev` with O_DIRECT, by
// write_in_known_function, every other block from the start (each one request).
class DirectWriter : public HeldChild {
 public:
  DirectWriter(const std::string& dev, int n) {
    fork_child([&] {
      const int fd = open(dev.c_str(), O_WRONLY | O_DIRECT);
      void* buf = nullptr;
      if (fd < 0 || posix_memalign(&buf, 4096, 4096) != 0) return false;
      std::memset(buf, 0xcd, 4096);
      for (int i = 0; i < n; ++i) {
        if (write_in_known_function(fd, buf, 4096, static_cast<long>(i) * 8192) != 4096)
          return false;
      }
      return true;
    });
  }
};

}  // namespace ebpf_metricsd::test
