// What the daemon reads of a user's process in /proc (profile/proc_files.h): maps lines as the
// kernel writes them, a process whose leader exited before its other threads, and a file at a
// mapped path that is no longer the file the process maps.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "ebpf_metricsd/profile/proc_files.h"

using namespace ebpf_metricsd::profiling;

TEST_CASE("proc files: maps lines, code, data, anonymous memory and the vDSO", "[proc_files]") {
  const std::string text =
      "55d0c0000000-55d0c0001000 r--p 00000000 fe:01 1234                       /usr/bin/x\n"
      "55d0c0001000-55d0c0005000 r-xp 00001000 fe:01 1234                       /usr/bin/x\n"
      "7f0000000000-7f0000021000 rw-p 00000000 00:00 0                          [heap]\n"
      "7f0000100000-7f0000200000 r-xp 00000000 00:00 0 \n"
      "7fff00000000-7fff00002000 r-xp 00000000 00:00 0                          [vdso]\n"
      "7f1000000000-7f1000001000 r-xp 00002000 08:10 99 /tmp/a b (deleted)\n"
      "not a line\n"
      "7f2000000000-7f2000001000";
  const auto lines = parse_maps(text);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0].start == 0x55d0c0000000);
  CHECK(lines[0].end == 0x55d0c0001000);
  CHECK_FALSE(lines[0].exec);
  CHECK(lines[1].exec);
  CHECK(lines[1].offset == 0x1000);
  CHECK(lines[1].dev == ((std::uint64_t{0xfe} << 32) | 1));
  CHECK(lines[1].inode == 1234);
  CHECK(lines[1].path == "/usr/bin/x");
  CHECK(lines[2].inode == 0);
  CHECK_FALSE(lines[2].vdso);
  CHECK(lines[3].path.empty());  // anonymous code (a JIT's)
  CHECK_FALSE(lines[3].vdso);
  CHECK(lines[4].vdso);
  CHECK(lines[5].path == "/tmp/a b (deleted)");
  CHECK(lines[5].dev == ((std::uint64_t{8} << 32) | 0x10));
}

TEST_CASE("proc files: a process whose leader exited before its threads", "[proc_files]") {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A thread that lives on, then the leader's own exit (not the process's).
    pthread_t t;
    pthread_create(
        &t, nullptr,
        [](void* fd) -> void* {
          // Once the leader is gone (its task a zombie), say so; then wait to be killed.
          const std::string stat = "/proc/" + std::to_string(getpid()) + "/stat";
          for (;;) {
            std::ifstream in(stat);
            std::string all((std::istreambuf_iterator<char>(in)), {});
            const auto paren = all.rfind(')');
            if (paren != std::string::npos && paren + 2 < all.size() && all[paren + 2] == 'Z')
              break;
            usleep(1000);
          }
          const char c = 1;
          if (write(*static_cast<int*>(fd), &c, 1) != 1) _exit(1);
          for (;;) pause();
        },
        &ready[1]);
    // The leader thread alone ends, as pthread_exit() would, but without unwinding through
    // the test runner's frames (which catch the unwind and abort).
    syscall(SYS_exit, 0);
  }
  close(ready[1]);
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  // The leader is a zombie, its process runs: alive, and its mappings are a thread's.
  CHECK(live_process_start_time(child) == process_start_time(child));
  CHECK(process_start_time(child) != 0);
  const auto lines = read_maps(child);
  bool code = false;
  for (const auto& m : lines) code = code || (m.exec && m.inode != 0);
  CHECK(code);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(process_start_time(child) == 0);
  CHECK(read_maps(child).empty());
}

TEST_CASE("proc files: a mapped file's path that now names another file is not opened",
          "[proc_files]") {
  const std::string dir = "/tmp/emd-proc-files-unit-" + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/lib.so";
  { std::ofstream(path) << std::string(4096, 'x'); }
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  // A range the process does not map, so that map_files/ cannot serve and the path must.
  MapsLine m;
  m.start = 0x1000;
  m.end = 0x2000;
  m.path = path;
  m.inode = st.st_ino;
  int fd = open_mapped_file(getpid(), m);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  m.path = path + " (deleted)";  // as the line shows a file deleted since: its path tried
  fd = open_mapped_file(getpid(), m);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  // Replaced (an upgrade writes a new file and renames it over the old): another inode.
  m.path = path;
  m.inode = st.st_ino + 1;
  CHECK(open_mapped_file(getpid(), m) == -1);
  // What the process does map is opened through map_files/ (root's), whatever its path says.
  if (geteuid() == 0) {
    const int file = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(file >= 0);
    void* at = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, file, 0);
    close(file);
    REQUIRE(at != MAP_FAILED);
    m.start = reinterpret_cast<std::uintptr_t>(at);
    m.end = m.start + 4096;
    m.path = "/nonexistent";
    fd = open_mapped_file(getpid(), m);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    munmap(at, 4096);
  }
  std::remove(path.c_str());
  rmdir(dir.c_str());
}
