#pragma once
// Workloads that fire a tracer's hooks a known number of times, shared by the kernel tests
// and the overhead benchmark. They throw std::runtime_error when a syscall fails.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

namespace ebpf_metricsd::workload {

inline void getppid_calls(long n) {
  for (long i = 0; i < n; ++i) syscall(SYS_getppid);
}

// Two threads bounce a byte over two pipes `rounds` times: each round wakes each side once.
inline void pipe_ping_pong(int rounds) {
  int ab[2], ba[2];
  if (pipe(ab) != 0 || pipe(ba) != 0) throw std::runtime_error("pipe");
  std::thread echo([&] {
    char c;
    for (int i = 0; i < rounds; ++i) {
      if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) break;
    }
  });
  char c = 'x';
  bool ok = true;
  for (int i = 0; ok && i < rounds; ++i) {
    ok = write(ab[1], &c, 1) == 1 && read(ba[0], &c, 1) == 1;
  }
  if (!ok) close(ab[1]);  // lets the echo thread see EOF
  echo.join();
  for (int fd : {ab[0], ab[1], ba[0], ba[1]}) close(fd);
  if (!ok) throw std::runtime_error("pipe ping-pong");
}

// First touches of `pages` fresh anonymous pages: one minor fault each (no huge pages).
inline void touch_anon_pages(long pages) {
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t len = static_cast<std::size_t>(pages * page);
  auto* p = static_cast<char*>(
      mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) throw std::runtime_error("mmap");
  madvise(p, len, MADV_NOHUGEPAGE);
  for (std::size_t off = 0; off < len; off += static_cast<std::size_t>(page)) p[off] = 1;
  munmap(p, len);
}

// open+read+close of /proc/self/stat: a seq_file (slab cache) with a kmalloc'ed buffer.
inline void read_proc_files(long n) {
  char buf[256];
  for (long i = 0; i < n; ++i) {
    const int fd = open("/proc/self/stat", O_RDONLY);
    if (fd < 0) throw std::runtime_error("open /proc/self/stat");
    const ssize_t got = read(fd, buf, sizeof buf);
    close(fd);
    if (got <= 0) throw std::runtime_error("read /proc/self/stat");
  }
}

}  // namespace ebpf_metricsd::workload
