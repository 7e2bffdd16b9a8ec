#pragma once
// Addresses to names, in the daemon and off the kernel's hot path: kernel frames from
// /proc/kallsyms (modules and BPF programs included), user frames from the ELF files a
// process maps, read with elfutils' libdw (.symtab, .dynsym, and debug files found by
// build-id or .gnu_debuglink under /usr/lib/debug; never debuginfod).

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
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

// How a stack was taken, which says what its innermost kernel frames are.
enum class StackOrigin {
  // By a tracing program (a tracepoint's bpf_get_stack): the innermost kernel frames are the
  // tracing machinery's own (bpf_prog_*, bpf_trace_run*, __bpf_trace_*, __traceiter_*,
  // perf_trace_*), not where the thread was; they go.
  Tracepoint,
  // Where a sample interrupted the thread, or where a sleeping thread waits: every frame is
  // the thread's (a sample inside a BPF program is CPU time spent there).
  Thread,
};

// The one way a stack becomes frames, for the profile and slow events alike, so that the
// same code reads the same on every page. Its rules:
// - the innermost frame of a stack is the address where it was taken, every other a return
//   address, looked up one byte before (the call, also where a call is a function's last
//   instruction);
// - kernel frames come before user frames; StackOrigin says which innermost kernel frames
//   are the tracing machinery's;
// - a user address outside every executable mapping of the process is no frame:
//   frame-pointer walking through code built without frame pointers reads such addresses,
//   and the user stack ends before the first one (where the innermost one is, the mappings
//   are read again first, for a library loaded since they were read).
// Thread-safe; one instance serves every tracer of a process.
class Symbolizer {
 public:
  explicit Symbolizer(UserSymbols::Limits limits = {}, std::string kallsyms = "/proc/kallsyms",
                      std::string modules = "/proc/modules");
  // The frames of a stack taken in process `pid`: kernel frames innermost first, then user
  // frames innermost first. Call soon after it was taken: the process may exit.
  std::vector<Frame> frames(std::uint32_t pid, std::span<const std::uint64_t> kernel_stack,
                            std::span<const std::uint64_t> user_stack, StackOrigin origin);
  std::vector<Frame> kernel_frames(std::span<const std::uint64_t> ips, StackOrigin origin);
  std::vector<Frame> user_frames(std::uint32_t pid, std::span<const std::uint64_t> ips);
  // Reads the mappings of a process seen for the first time (or since it exec'd) while it
  // lives, so that its stacks can be symbolized after it exits.
  void capture(std::uint32_t pid);
  // Forgets the processes that had exited already at the previous call, whose stacks have
  // all been symbolized by now: call once per round of reads of every tracer that takes
  // stacks (the daemon's drain round), never from one reader alone.
  void end_round();

  struct Sizes {
    std::size_t elf_files, processes, names, kernel_symbols;
  };
  Sizes sizes();

 private:
  void refresh_kernel();  // caller holds mutex_
  std::mutex mutex_;
  KernelSymbols kernel_;
  UserSymbols user_;
  std::chrono::steady_clock::time_point kernel_read_{};
};

// "_ZN3foo3barEv" -> "foo::bar()"; other names unchanged.
std::string demangle(const std::string& name);

}  // namespace ebpf_metricsd::profiling
