// JIT code's names: the perf map a process writes (/tmp/perf-PID.map), read as hostile input.
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/profile/proc_files.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "elf_module.h"
#include "text.h"

namespace ebpf_metricsd::profiling {

using text::read_file;

namespace {

// The pid of `tgid` in its own pid namespace (the NSpid line of /proc/PID/status), which the
// perf map's name uses; `tgid` itself where there is none.
pid_t namespace_pid(pid_t tgid) {
  std::istringstream in(read_file("/proc/" + std::to_string(tgid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    const auto last = line.find_last_of(" \t");
    const long n = std::strtol(line.c_str() + last + 1, nullptr, 10);
    return n > 0 ? static_cast<pid_t>(n) : tgid;
  }
  return tgid;
}

}  // namespace

// A perf map is a file its process's user writes, read as hostile input: only a regular file
// (not followed through a symlink, opened non-blocking) owned by the process's owner or root,
// at most max_jit_map_file; lines "START SIZE name" in hex, others skipped; names cut at 256
// bytes.
std::string UserSymbols::jit_name(pid_t tgid, Process& p, std::uint64_t address) {
  const auto find = [&]() -> std::string {
    auto at = std::upper_bound(p.jit.begin(), p.jit.end(), address,
                               [](std::uint64_t a, const JitSymbol& j) { return a < j.start; });
    // An entry that covers it, among the nearest below.
    for (int back = 0; at != p.jit.begin() && back < 64; ++back) {
      --at;
      if (address < at->end) return at->name;
    }
    return "";
  };
  if (std::string name = find(); !name.empty()) return name;
  const auto now = std::chrono::steady_clock::now();
  if (p.jit_read && now - p.jit_read_at < std::chrono::seconds(1)) return "";
  p.jit_read = true;
  p.jit_read_at = now;
  // Opened below the process's root as if it were /, never through a symlink (openat2):
  // a process can make its /tmp anything, in a mount namespace of its own.
  const std::string proc = "/proc/" + std::to_string(tgid);
  const int root = ::open((proc + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return "";
  const std::string path = "tmp/perf-" + std::to_string(namespace_pid(tgid)) + ".map";
  open_how how{};
  how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const int fd = static_cast<int>(syscall(SYS_openat2, root, path.c_str(), &how, sizeof how));
  close(root);
  if (fd < 0) return "";
  struct stat st {
  }, owner{};
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  // A map refused before is not read again until it changes.
  const JitStamp stamp{static_cast<std::uint64_t>(st.st_size),
                       static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000u +
                           static_cast<std::uint64_t>(st.st_mtim.tv_nsec)};
  if (regular && p.jit_refused == stamp) {
    close(fd);
    return "";
  }
  const bool ok = regular && static_cast<std::uint64_t>(st.st_size) <= limits_.max_jit_map_file &&
                  ::stat(proc.c_str(), &owner) == 0 && st.st_uid == owner.st_uid;
  std::string text;
  if (ok) {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  close(fd);
  held_.jit_bytes -= p.jit_bytes;
  p.jit.clear();
  p.jit_bytes = 0;
  const auto refuse = [&] {
    if (regular) p.jit_refused = stamp;
    ++held_.jit_maps_refused;
    return std::string();
  };
  if (!ok) return refuse();
  // Lines "START SIZE name", hex; others skipped. Parsing stops where the entries would not
  // fit in what the budget has left.
  const std::size_t room =
      limits_.max_jit_bytes > held_.jit_bytes ? limits_.max_jit_bytes - held_.jit_bytes : 0;
  std::vector<JitSymbol> jit;
  std::size_t bytes = 0;
  std::string_view rest(text);
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    std::uint64_t start = 0, size = 0;
    const char* at = line.data();
    const char* end = line.data() + line.size();
    auto r1 = std::from_chars(at, end, start, 16);
    if (r1.ec != std::errc() || r1.ptr == end || *r1.ptr != ' ') continue;
    auto r2 = std::from_chars(r1.ptr + 1, end, size, 16);
    if (r2.ec != std::errc() || r2.ptr == end || *r2.ptr != ' ') continue;
    if (size == 0 || start + size < start) continue;
    const std::string_view name =
        line.substr(static_cast<std::size_t>(r2.ptr + 1 - line.data()), 256);
    if (name.empty()) continue;
    bytes += sizeof(JitSymbol) + name.size();
    if (bytes > room) return refuse();
    jit.push_back({start, start + size, std::string(name)});
  }
  std::stable_sort(jit.begin(), jit.end(),
                   [](const JitSymbol& a, const JitSymbol& b) { return a.start < b.start; });
  p.jit = std::move(jit);
  p.jit_bytes = bytes;
  held_.jit_bytes += bytes;
  return find();
}

}  // namespace ebpf_metricsd::profiling
