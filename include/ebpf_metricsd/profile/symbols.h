#pragma once
// Addresses to names, in the daemon and off the kernel's hot path: kernel frames from
// /proc/kallsyms (modules and BPF programs included), user frames from the ELF files a
// process maps, read with elfutils' libdw (.symtab, .dynsym, and debug files found by
// build-id or .gnu_debuglink under /usr/lib/debug; never debuginfod).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ebpf_metricsd::profiling {

struct Frame {
  std::string function;  // demangled; `module+0xoffset` when the module has no symbol there
  std::string module;    // the file as the process maps it, "[kernel]", "[ext4]", "[vdso]"...
  std::string build_id;  // lower-case hex, "" when unknown
  // User frames: the offset in the module's file (what build-id symbolizers take);
  // kernel frames: the address.
  std::uint64_t address = 0;
  bool kernel = false;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const Frame&) const = default;
};

class KernelSymbols {
 public:
  // `kallsyms`: the file to read; `modules`: what says that modules changed.
  explicit KernelSymbols(std::string kallsyms = "/proc/kallsyms",
                         std::string modules = "/proc/modules");
  // Reads the table again when modules were loaded or unloaded, or BPF programs came or
  // went, since the last read (or on the first call). Cheap when nothing changed.
  void refresh();
  // The symbol at `address`; `return_address`: the frame is a return address (look up
  // address - 1, the call).
  Frame resolve(std::uint64_t address, bool return_address) const;
  std::size_t symbols() const { return starts_.size(); }

 private:
  std::string signature() const;
  void load();
  std::string kallsyms_, modules_, signature_;
  bool loaded_ = false;
  // Text symbols by address; names in one arena ("name\0module\0").
  std::vector<std::uint64_t> starts_;
  std::vector<std::uint32_t> names_;
  std::string arena_;
};

// An ELF file and its symbols, opened once per (device, inode) and kept while used.
class ElfModule;

class UserSymbols {
 public:
  struct Limits {
    std::size_t max_modules = 256;     // ELF files open at once
    std::size_t max_processes = 8192;  // processes whose mappings are kept
    std::size_t max_names = 1u << 20;  // names cached over all modules
  };
  explicit UserSymbols(Limits limits);
  UserSymbols() : UserSymbols(Limits{}) {}
  ~UserSymbols();
  UserSymbols(const UserSymbols&) = delete;
  UserSymbols& operator=(const UserSymbols&) = delete;

  // Captures the mappings of process `tgid` (and opens the files they map) unless they are
  // known: call as soon as a process is seen, so that it can be symbolized after it exits.
  // `again`: read them again even if known (it exec'd, or mapped more since), as long as it
  // still runs; a process that is gone keeps what was captured.
  void capture(pid_t tgid, bool again = false);
  Frame resolve(pid_t tgid, std::uint64_t address, bool return_address);
  // Forgets processes that had exited already at the previous call: their last stacks have
  // been symbolized by now (call once per read of the kernel side, after it). Closes the
  // files no process it knows maps.
  void forget_exited();

  std::size_t modules() const { return modules_.size(); }
  std::size_t processes() const { return processes_.size(); }
  std::size_t names() const;

 private:
  struct Mapping {
    std::uint64_t start, end, offset;
    std::string path;  // as /proc/PID/maps shows it
    std::uint64_t dev = 0, inode = 0;
    // The file, while it is among the max_modules open ones; opened again when needed (the
    // process still running) after it was closed.
    std::weak_ptr<ElfModule> elf;
  };
  struct Process {
    std::uint64_t start_time = 0;  // /proc/PID/stat field 22: tells a reused pid
    bool exited = false;           // seen gone by forget_exited()
    std::vector<Mapping> mappings;
    std::list<pid_t>::iterator lru;
  };
  void forget(pid_t tgid);
  std::shared_ptr<ElfModule> open_module(pid_t tgid, const Mapping& m, std::uint64_t dev,
                                         std::uint64_t inode);
  Limits limits_;
  std::map<pid_t, Process> processes_;
  std::list<pid_t> process_lru_;  // most recently used first
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::weak_ptr<ElfModule>> by_inode_;
  std::list<std::shared_ptr<ElfModule>> modules_;  // the open files, most recently used first
};

// "_ZN3foo3barEv" -> "foo::bar()"; other names unchanged.
std::string demangle(const std::string& name);

}  // namespace ebpf_metricsd::profiling
