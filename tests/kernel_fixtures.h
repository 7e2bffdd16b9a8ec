#pragma once
// Kernel objects the tests and the benchmark set up for themselves: a loop device and a
// veth pair into a network namespace. They throw std::runtime_error when setup fails and
// remove what they made when destroyed.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "test_support.h"

namespace ebpf_metricsd::test {

// Writes out what file `fd` holds and drops its pages from the page cache (those no process
// maps). Whether both calls succeeded.
inline bool evict_pages(int fd) {
  return fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
}

// A file of `pages` pages filled with `fill` on a real disk (/var/tmp: tmpfs pages are never
// read in), written out and evicted from the page cache. Unlinked at once; closed when
// destroyed.
class EvictedFile {
 public:
  EvictedFile(long pages, char fill)
      : size_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE) * pages)) {
    char path[] = "/var/tmp/emd-file-XXXXXX";
    fd_ = mkstemp(path);
    if (fd_ < 0) throw std::runtime_error("mkstemp");
    unlink(path);
    const std::string data(size_, fill);
    if (write(fd_, data.data(), data.size()) != static_cast<ssize_t>(data.size()) ||
        !evict_pages(fd_)) {
      close(fd_);
      throw std::runtime_error("cannot write and evict a test file");
    }
  }
  ~EvictedFile() { close(fd_); }
  EvictedFile(const EvictedFile&) = delete;
  EvictedFile& operator=(const EvictedFile&) = delete;
  int fd() const { return fd_; }
  std::size_t size() const { return size_; }

 private:
  int fd_ = -1;
  std::size_t size_;
};

// Evicts file `path` from the page cache (written out first): the next exec of a program
// reads it from the disk again, as on a host that has not run it lately. Whether no page of
// it stays cached (one that a process maps, or on tmpfs, does).
inline bool evict_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool evicted = evict_pages(fd);
  const off_t size = lseek(fd, 0, SEEK_END);
  if (evicted && size > 0) {
    void* map = mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    const long page = sysconf(_SC_PAGESIZE);
    std::string resident(static_cast<std::size_t>((size + page - 1) / page), '\0');
    evicted = map != MAP_FAILED &&
              mincore(map, static_cast<std::size_t>(size),
                      reinterpret_cast<unsigned char*>(resident.data())) == 0 &&
              resident.find_first_not_of('\0') == std::string::npos;
    if (map != MAP_FAILED) munmap(map, static_cast<std::size_t>(size));
  }
  close(fd);
  return evicted;
}

// Removes what a run that died without cleaning up left behind (its name carries its pid):
// a stale veth would keep the test addresses' route, a stale loop device its file.
inline void remove_leftovers() {
  const auto dead = [](const std::string& name, const std::string& prefix) {
    if (name.rfind(prefix, 0) != 0) return false;
    const std::string pid = name.substr(prefix.size());
    return !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos &&
           access(("/proc/" + pid).c_str(), F_OK) != 0;
  };
  std::istringstream links(run_capture_line("ls /sys/class/net"));
  std::string name;
  while (links >> name) {
    if (dead(name, "emdv")) run_quiet("ip link del " + name);
  }
  std::istringstream nss(run_capture_line("ip netns list | cut -d' ' -f1"));
  while (nss >> name) {
    if (dead(name, "emdtest")) run_quiet("ip netns del " + name);
  }
  // Backing files are /var/tmp/emd-loop-<pid>-XXXXXX.
  std::istringstream loops(run_capture_line("losetup -a -O NAME,BACK-FILE -n"));
  std::string line;
  while (std::getline(loops, line)) {
    std::istringstream f(line);
    std::string dev, file;
    if (!(f >> dev >> file) || file.rfind("/var/tmp/emd-loop-", 0) != 0) continue;
    const std::string rest = file.substr(std::string("/var/tmp/emd-loop-").size());
    if (dead("p" + rest.substr(0, rest.find('-')), "p")) {
      run_quiet("losetup -d " + dev);
      unlink(file.c_str());
    }
  }
}

// A loop device over a temporary 16 MiB file on a real disk.
class LoopDevice {
 public:
  LoopDevice() {
    remove_leftovers();
    std::string tmpl = "/var/tmp/emd-loop-" + std::to_string(getpid()) + "-XXXXXX";
    char* path = tmpl.data();
    const int fd = mkstemp(path);
    if (fd < 0) throw std::runtime_error("mkstemp");
    const bool sized = ftruncate(fd, 16 << 20) == 0;
    close(fd);
    file_ = path;
    dev_ = run_capture_line("losetup --find --show " + file_);
    if (!sized || dev_.rfind("/dev/loop", 0) != 0) {
      unlink(file_.c_str());
      throw std::runtime_error("losetup failed: " + dev_);
    }
    name_ = dev_.substr(5);
  }
  ~LoopDevice() {
    run_quiet("losetup -d " + dev_);
    unlink(file_.c_str());
  }
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;
  const std::string& dev() const { return dev_; }
  const std::string& name() const { return name_; }
  // The largest request the block layer sends the device: a larger write is split.
  void limit_requests_kib(int kib) const {
    std::ofstream out("/sys/block/" + name_ + "/queue/max_sectors_kb");
    out << kib << std::flush;
    if (!out) throw std::runtime_error("cannot limit the requests of " + dev_);
  }

  // /sys/block/<dev>/stat: completed reads, sectors read, completed writes, sectors written.
  std::array<std::uint64_t, 4> stat() const {
    std::ifstream in("/sys/block/" + name_ + "/stat");
    std::uint64_t f[8] = {};
    for (auto& v : f) in >> v;
    return {f[0], f[2], f[4], f[6]};
  }
  // The writes the device completed since `from` (a stat()), once there are at least `n`, or
  // after 6 s.
  std::uint64_t writes_since(const std::array<std::uint64_t, 4>& from, std::uint64_t n) const {
    for (int i = 0; i < 600 && stat()[2] - from[2] < n; ++i) usleep(10000);
    return stat()[2] - from[2];
  }

 private:
  std::string file_, dev_, name_;
};

// A veth pair: `host()` in this namespace (169.254.77.1), its peer (169.254.77.2) in a
// namespace of its own. Permanent neighbour entries on both ends (no ARP) and IPv6 off (no
// router solicitations, no DAD): what the caller sends is all the host end transmits.
class VethPair {
 public:
  VethPair() {
    remove_leftovers();
    const std::string id = std::to_string(getpid());
    ns_ = "emdtest" + id;
    host_ = "emdv" + id;
    peer_ = "emdp" + id;
    try {
      must_run("ip netns add " + ns_);
      must_run("ip link add " + host_ + " type veth peer name " + peer_ + " netns " + ns_);
      run_quiet("sysctl -w net.ipv6.conf." + host_ + ".disable_ipv6=1");
      run_quiet("ip netns exec " + ns_ + " sysctl -w net.ipv6.conf." + peer_ + ".disable_ipv6=1");
      must_run("ip addr add 169.254.77.1/24 dev " + host_);
      must_run("ip netns exec " + ns_ + " ip addr add 169.254.77.2/24 dev " + peer_);
      const std::string peer_mac =
          run_capture_line("ip netns exec " + ns_ + " cat /sys/class/net/" + peer_ + "/address");
      const std::string host_mac = run_capture_line("cat /sys/class/net/" + host_ + "/address");
      must_run("ip neigh replace 169.254.77.2 lladdr " + peer_mac + " dev " + host_ +
               " nud permanent");
      // The peer answers each datagram (ICMP port unreachable): it must not ARP for us.
      must_run("ip netns exec " + ns_ + " ip neigh replace 169.254.77.1 lladdr " + host_mac +
               " dev " + peer_ + " nud permanent");
      must_run("ip netns exec " + ns_ + " ip link set " + peer_ + " up");
      must_run("ip link set " + host_ + " up");
    } catch (...) {
      cleanup();
      throw;
    }
  }
  ~VethPair() { cleanup(); }
  VethPair(const VethPair&) = delete;
  VethPair& operator=(const VethPair&) = delete;
  const std::string& host() const { return host_; }

  // tx packets and bytes of the host end, from /proc/net/dev.
  std::pair<std::uint64_t, std::uint64_t> tx() const {
    std::ifstream in("/proc/net/dev");
    std::string line;
    while (std::getline(in, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name != host_) continue;
      std::istringstream f(line.substr(colon + 1));
      std::uint64_t v[16] = {};
      for (auto& x : v) f >> x;
      return {v[9], v[8]};  // tx packets, tx bytes
    }
    throw std::runtime_error("no " + host_ + " in /proc/net/dev");
  }

 private:
  void cleanup() {
    run_quiet("ip link del " + host_);
    run_quiet("ip netns del " + ns_);
  }
  std::string ns_, host_, peer_;
};

}  // namespace ebpf_metricsd::test
