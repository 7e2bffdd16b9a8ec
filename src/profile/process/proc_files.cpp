#include "ebpf_metricsd/profile/proc_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

namespace ebpf_metricsd::profiling {

std::string read_proc_file(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end, or the process gone (ESRCH): what was read
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

namespace {
// /proc/PID/stat's state (field 3) and start time (field 22); start 0 when gone.
std::pair<char, std::uint64_t> state_and_start(pid_t tgid) {
  const std::string stat = read_proc_file("/proc/" + std::to_string(tgid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return {'?', 0};
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  char state = '?';
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) state = field.empty() ? '?' : field[0];
    if (i == 22) return {state, std::strtoull(field.c_str(), nullptr, 10)};
  }
  return {state, 0};
}
}  // namespace

std::uint64_t process_start_time(pid_t tgid) { return state_and_start(tgid).second; }

namespace {
// Whether thread group tgid has a thread other than its leader (a leader that exited first
// stays a zombie until the last one does).
bool other_thread(pid_t tgid) {
  const std::string dir = "/proc/" + std::to_string(tgid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return false;
  bool found = false;
  const std::string leader = std::to_string(tgid);
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || leader == e->d_name) continue;
    found = true;
    break;
  }
  closedir(d);
  return found;
}
}  // namespace

std::uint64_t live_process_start_time(pid_t tgid) {
  const auto [state, start] = state_and_start(tgid);
  if (state == 'X') return 0;
  if (state == 'Z' && !other_thread(tgid)) return 0;
  return start;
}

std::vector<MapsLine> parse_maps(const std::string& text) {
  std::vector<MapsLine> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // start-end perms offset dev inode path
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset,
                    &major, &minor, &inode, &path_at) < 7)
      continue;
    MapsLine m;
    if (path_at > 0) m.path = line.substr(static_cast<std::size_t>(path_at));
    m.vdso = inode == 0 && m.path == "[vdso]";
    m.start = start;
    m.end = end;
    m.offset = offset;
    m.dev = (static_cast<std::uint64_t>(major) << 32) | minor;
    m.inode = inode;
    m.exec = perms[2] == 'x';
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<MapsLine> read_maps(pid_t tgid) {
  const std::string proc = "/proc/" + std::to_string(tgid);
  std::string text = read_proc_file(proc + "/maps");
  if (text.empty()) {
    // The leader gone before its threads: a live thread's view of the same memory.
    if (DIR* d = opendir((proc + "/task").c_str())) {
      while (const dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        text = read_proc_file(proc + "/task/" + e->d_name + "/maps");
        if (!text.empty()) break;
      }
      closedir(d);
    }
  }
  return parse_maps(text);
}

int open_mapped_file(pid_t tgid, const MapsLine& m) {
  char range[64];
  std::snprintf(range, sizeof range, "%llx-%llx", static_cast<unsigned long long>(m.start),
                static_cast<unsigned long long>(m.end));
  const std::string proc = "/proc/" + std::to_string(tgid);
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int fd = ::open((proc + "/map_files/" + range).c_str(), kFlags);
  if (fd >= 0) return fd;
  std::string path = m.path;
  if (const auto deleted = path.rfind(" (deleted)");
      deleted != std::string::npos && deleted + 10 == path.size()) {
    path.erase(deleted);
  }
  if (path.empty() || path.front() != '/') return -1;
  fd = ::open((proc + "/root" + path).c_str(), kFlags);
  struct stat st {};
  if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_ino != m.inode)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace ebpf_metricsd::profiling
