#pragma once
// What the daemon reads of a user's process in /proc.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ebpf_metricsd::profiling {

// A file a process maps, as the walk in the kernel names it (process_manager.h): its
// identity, the path the process mapped it by, and a descriptor of it (the holder's to close;
// -1: none).
struct MappedFileRef {
  std::uint64_t dev = 0, inode = 0;
  std::string path;
  int fd = -1;
};

// A file of /proc read whole with read(2): what could be read ("" when it cannot be opened;
// a process that exits meanwhile ends it early), never an exception.
std::string read_proc_file(const std::string& path);

// Field 22 of /proc/PID/stat, the start time in clock ticks since boot: tells a process from
// a later one that reuses its pid. 0 when it is gone.
std::uint64_t process_start_time(pid_t tgid);
// The same, 0 also when it has exited and waits to be reaped (a zombie whose threads have
// all exited; a leader that exited before its other threads is a zombie of a live process).
std::uint64_t live_process_start_time(pid_t tgid);

// One line of /proc/PID/maps.
struct MapsLine {
  std::uint64_t start = 0, end = 0, offset = 0;
  std::uint64_t dev = 0;  // major << 32 | minor, as the line gives it
  std::uint64_t inode = 0;
  bool exec = false;
  bool vdso = false;  // the vDSO; every other line of inode 0 is anonymous memory
  std::string path;   // as the line shows it ("/usr/lib/x.so (deleted)", "[vdso]")
};

// The lines of a maps file's text (those that do not parse left out).
std::vector<MapsLine> parse_maps(const std::string& text);
// Process tgid's mappings: /proc/PID/maps, or, once its leader has exited while other threads
// run (the leader a zombie without memory of its own), a live thread's. Empty when gone.
std::vector<MapsLine> read_maps(pid_t tgid);

// A descriptor of the file a process maps as `m`: /proc/PID/map_files/ opens exactly what
// the process maps, also when the file was deleted or replaced since, or lives in another
// mount namespace (a container); else the path in the process's root, taken only when it is
// still the inode the line names (a file replaced by an upgrade is another program). -1 when
// neither opens (the process is gone). Non-blocking: a FIFO or a device a user maps does not
// hold the reader.
int open_mapped_file(pid_t tgid, const MapsLine& m);

}  // namespace ebpf_metricsd::profiling
