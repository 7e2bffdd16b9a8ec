#pragma once
// Workloads that fire a tracer's hooks a known number of times, shared by the kernel tests
// and the overhead benchmark. They throw std::runtime_error when a syscall fails.

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
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

// `n` blocking loopback TCP connects to `addr` (a listening socket), each closed at once
// with a reset, so that no TIME_WAIT sockets pile up and exhaust the ephemeral ports.
inline void tcp_connects(const sockaddr_in& addr, long n) {
  const linger reset{1, 0};
  for (long i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd);
    if (!ok) throw std::runtime_error("connect");
  }
}

// `n` loopback TCP connects to a port nobody listens on: each is refused (a failure).
inline void tcp_refused_connects(const sockaddr_in& addr, long n) {
  for (long i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    if (ok) throw std::runtime_error("connect to a closed port succeeded");
  }
}

// `n` UDP datagrams of `payload` bytes from `fd` to `to`.
inline void udp_sends(int fd, const sockaddr_in& to, long n, std::size_t payload) {
  char buf[1500] = {};
  for (long i = 0; i < n; ++i) {
    if (sendto(fd, buf, payload, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to) !=
        static_cast<ssize_t>(payload)) {
      throw std::runtime_error("sendto");
    }
  }
}

// `n` 4 KiB O_DIRECT reads from `fd` (a block device), at spread-out offsets.
inline void direct_reads(int fd, void* aligned_buf, long n) {
  for (long i = 0; i < n; ++i) {
    if (pread(fd, aligned_buf, 4096, static_cast<off_t>(i % 2048) * 8192) != 4096) {
      throw std::runtime_error("pread");
    }
  }
}

// `n` reads of one cached page of `fd`.
inline void cached_reads(int fd, long n) {
  char buf[4096];
  for (long i = 0; i < n; ++i) {
    if (pread(fd, buf, sizeof buf, static_cast<off_t>(i % 256) * 4096) <= 0) {
      throw std::runtime_error("pread");
    }
  }
}

}  // namespace ebpf_metricsd::workload
