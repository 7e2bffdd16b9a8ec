#pragma once
// Addresses to names, in the daemon and off the kernel's hot path: kernel frames from
// /proc/kallsyms (modules and BPF programs included), user frames from the ELF files a
// process maps, read with elfutils' libdw (.symtab, .dynsym, and debug files found by
// build-id or .gnu_debuglink under /usr/lib/debug; never debuginfod).

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/proc_files.h"

namespace ebpf_metricsd::profiling {

struct Frame {
  std::string function;  // demangled; `module+0xoffset` when the module has no symbol there
  std::string module;    // the file as the process maps it, "[kernel]", "[ext4]", "[vdso]"...
  std::string build_id;  // lower-case hex, "" when unknown
  // User frames: the offset in the module's file (what build-id symbolizers take);
  // kernel frames: the address.
  std::uint64_t address = 0;
  bool kernel = false;
  // Where DWARF is on the host and lines were asked for: the functions inlined at the
  // address, innermost first, each with its line there, then `function` itself with the
  // line of the address (or of the call the innermost inlined function came from). Empty
  // without DWARF.
  std::vector<SourceLine> lines;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const Frame&) const = default;
};

// The heap a string holds beside itself: its text past the inline buffer.
std::size_t string_heap_bytes(const std::string& s);
// The heap source lines hold: their array and their strings'.
std::size_t lines_heap_bytes(const std::vector<SourceLine>& lines);
// The heap a frame holds beside itself: its strings past the inline buffer, its lines.
std::size_t frame_heap_bytes(const Frame& f);
// What a vector of frames holds: the frames and their heap.
std::size_t frames_bytes(const std::vector<Frame>& frames);

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
  // The table's memory: addresses, name offsets and the names.
  std::size_t bytes() const {
    return starts_.capacity() * sizeof(std::uint64_t) + names_.capacity() * sizeof(std::uint32_t) +
           arena_.capacity();
  }

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
    std::size_t max_modules = 256;           // ELF files open at once
    std::size_t max_processes = 8192;        // processes whose mappings are kept
    std::size_t max_name_bytes = 16u << 20;  // names and lines cached over all modules
    // Perf maps of JIT code (/tmp/perf-PID.map) read: at most this large a file, and this
    // much held over all processes (a map that does not fit is not read).
    std::size_t max_jit_map_file = 16u << 20;
    std::size_t max_jit_bytes = 32u << 20;
    // DWARF read for source lines, over all open files: the size of their .debug_*
    // sections, counted twice, and 32 KiB a file (what libdw builds from them). A file whose
    // DWARF does not fit in what is left has no lines until others close.
    std::uint64_t max_dwarf_bytes = std::uint64_t{16} << 20;
    ElfLimits files;  // what a file may be (elf_file.h)
  };
  using Refusals = std::array<std::uint64_t, kElfRefusals.size()>;
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

  // What capture() reads of a process while it lives: its executable mappings and a
  // descriptor of each file they map. Taken without the symbolizer's lock (a reader busy
  // unwinding must not make a short-lived process's mappings come too late), installed
  // with it.
  struct Snapshot;
  static std::shared_ptr<Snapshot> snapshot(pid_t tgid);
  void install(Snapshot& snapshot, bool again);
  // Reads the mappings of a known process again because an address was in none of them
  // (it mapped more since: dlopen, or the libraries after an exec). Not if they were read
  // after the stack was taken (`taken_by_ns`, CLOCK_MONOTONIC, a time no earlier than the
  // stack's; 0: unknown): reading again finds nothing the stack could be in. Else at once
  // while each read finds a change, then with a growing pause (10 ms doubling to 10 s)
  // while reading again finds nothing new: an address in no file (JIT code) would ask at
  // every sample.
  void refresh(pid_t tgid, std::uint64_t taken_by_ns = 0);
  // `lines`: with the source lines of the address (Frame::lines) where DWARF has them.
  Frame resolve(pid_t tgid, std::uint64_t address, bool return_address, bool lines = false);
  // The frame at `offset` of file `file` (its descriptor taken), named as resolve() names an
  // address of a mapping of it: for frames the walk in the kernel kept by file.
  Frame resolve_file(MappedFileRef file, std::uint64_t offset, bool return_address,
                     bool lines = false);
  // Forgets processes that had exited already at the previous call: their last stacks have
  // been symbolized by now (call once per read of the kernel side, after it). Closes the
  // files no process it knows maps.
  void forget_exited();

  std::size_t modules() const { return modules_.size(); }
  std::size_t processes() const { return processes_.size(); }
  // Whether the mappings of process `tgid` were read.
  bool knows(pid_t tgid) const { return processes_.count(tgid) > 0; }
  std::size_t names() const;
  // What the open files hold: names and lines cached (as max_name_bytes counts them), DWARF
  // read for lines (as max_dwarf_bytes counts it), how many lookups found no lines because
  // a file's DWARF did not fit, and how many files' line tables could not be read.
  struct Held {
    std::size_t name_bytes = 0;
    std::size_t jit_bytes = 0;  // perf map entries held
    // Perf maps not read: not a regular file, too large, another owner, over the budget.
    std::uint64_t jit_maps_refused = 0;
    std::uint64_t dwarf_bytes = 0, max_dwarf_bytes = 0, lines_over_budget = 0;
    std::uint64_t dwarf_broken = 0;  // files whose line tables could not be read
  };
  const Held& held() const { return held_; }
  // The symbol, string and CFI tables of the open files, in all (what they read of them at
  // most), and the symbol indexes built from them.
  std::uint64_t table_bytes() const;
  // Files refused so far, by ElfRefusal; a refused file is not tried again while it is
  // remembered (up to 4 * max_modules of them).
  const Refusals& refused() const { return refused_; }

 private:
  struct JitSymbol {
    std::uint64_t start, end;
    std::string name;
  };
  struct JitStamp {  // a perf map's size and modification time
    std::uint64_t size = 0, mtime_ns = 0;
    bool operator==(const JitStamp&) const = default;
  };
  struct Mapping {
    std::uint64_t start, end, offset;
    std::string path;  // as /proc/PID/maps shows it
    std::uint64_t dev = 0, inode = 0;
    // The file, while it is among the max_modules open ones; opened again when needed (the
    // process still running) after it was closed.
    std::weak_ptr<ElfModule> elf;
  };
  struct Process {
    std::uint64_t start_time = 0;                // /proc/PID/stat field 22: tells a reused pid
    bool exited = false;                         // seen gone by forget_exited()
    std::uint64_t read_ns = 0;                   // when the mappings were read (CLOCK_MONOTONIC)
    std::chrono::milliseconds refresh_pause{0};  // before refresh() reads them again
    std::vector<Mapping> mappings;
    std::list<pid_t>::iterator lru;
    // JIT code named by the process's perf map (/tmp/perf-PID.map, as the process sees /tmp):
    // read when an address in its anonymous executable memory is first looked up, and again,
    // at most once a second, when such an address is in no entry. Sorted by start.
    std::vector<JitSymbol> jit;
    std::size_t jit_bytes = 0;
    std::chrono::steady_clock::time_point jit_read_at{};
    bool jit_read = false;
    std::optional<JitStamp> jit_refused;  // the map as it was when refused
  };
  void forget(pid_t tgid);
  // The name perf map entries give `address` in process `p` ("" for none).
  std::string jit_name(pid_t tgid, Process& p, std::uint64_t address);
  std::map<pid_t, Process>::iterator erase(std::map<pid_t, Process>::iterator it);
  // The module of the file mapped by m: the one open already, else from `fd` (taken; -1:
  // opened from /proc/PID while the process runs).
  std::shared_ptr<ElfModule> open_module(pid_t tgid, const Mapping& m, int fd = -1);
  // The module of file (dev, inode), open here or opened from `fd` (taken; -1: none).
  std::shared_ptr<ElfModule> open_module(std::uint64_t dev, std::uint64_t inode, std::string path,
                                         int fd);
  // Names `offset` of module `elf` (shown as `module`).
  Frame name_in(const std::shared_ptr<ElfModule>& elf, Frame f, std::uint64_t offset,
                bool return_address, bool lines);
  Limits limits_;
  // Before the modules: each gives back what it took when it closes.
  Held held_;
  std::map<pid_t, Process> processes_;
  std::list<pid_t> process_lru_;  // most recently used first
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::weak_ptr<ElfModule>> by_inode_;
  std::list<std::shared_ptr<ElfModule>> modules_;  // the open files, most recently used first
  Refusals refused_{};
  std::set<std::pair<std::uint64_t, std::uint64_t>> refused_files_;  // by (dev, inode)
};

// How a kernel stack was taken, which says what its innermost frames are.
enum class StackOrigin {
  // Where a sample interrupted the thread: the innermost frame is the address it was at, and
  // every frame is the thread's (a sample inside a BPF program is CPU time spent there).
  Interrupt,
  // By a call: a tracing program's bpf_get_stack, or where a sleeping thread waits. Every
  // frame is a return address, and the innermost ones of a tracing program's stack are the
  // tracing machinery's (bpf_prog_*, bpf_trace_run*, __bpf_trace_*, __traceiter_*,
  // perf_trace_*, bpf_get_stack*), not where the thread was: they go.
  Call,
};

// The one way a stack becomes frames, for the profile and slow events alike, so that the
// same code reads the same on every page. Its rules:
// - a return address is looked up one byte before (the call, also where a call is a
//   function's last instruction); every frame is one but the innermost of an interrupted
//   kernel stack and of a user stack (the instruction the thread was at);
// - kernel frames come before user frames; StackOrigin says what the kernel ones are;
// - a user address outside every executable mapping of the process is no frame:
//   frame-pointer walking through code built without frame pointers reads such addresses,
//   and the user stack ends before the first one (where the innermost one is, the mappings
//   are read again first, for a library loaded since they were read); a process whose
//   mappings were never read (gone before it was seen) has one frame, "[mappings not read]".
// Thread-safe; one instance serves every tracer of a process.
class Symbolizer {
 public:
  explicit Symbolizer(UserSymbols::Limits limits = {}, std::string kallsyms = "/proc/kallsyms",
                      std::string modules = "/proc/modules");
  // The frames of a stack taken in process `pid`: kernel frames innermost first, then user
  // frames innermost first. Call soon after it was taken: the process may exit.
  // `taken_by_ns`: a CLOCK_MONOTONIC time no earlier than when the stack was taken (0:
  // unknown), which tells whether reading the process's mappings again could help.
  std::vector<Frame> frames(std::uint32_t pid, std::span<const std::uint64_t> kernel_stack,
                            std::span<const std::uint64_t> user_stack, StackOrigin origin,
                            bool lines = false, std::uint64_t taken_by_ns = 0);
  std::vector<Frame> kernel_frames(std::span<const std::uint64_t> ips, StackOrigin origin);
  // `lines`: user frames carry their source lines where DWARF has them (Frame::lines).
  std::vector<Frame> user_frames(std::uint32_t pid, std::span<const std::uint64_t> ips,
                                 bool lines = false, std::uint64_t taken_by_ns = 0);
  // Reads the mappings of a process seen for the first time (or, `execed`, since it exec'd)
  // while it lives, so that its stacks can be symbolized after it exits: at once, without
  // waiting for the symbolizer (installed at its next use).
  void capture(std::uint32_t pid, bool execed);
  // Forgets the processes that had exited already at the previous call, whose stacks have
  // all been symbolized by now: call once per round of reads of every tracer that takes
  // stacks (the daemon's drain round), never from one reader alone.
  void end_round();
  // Where the files of frames the walk in the kernel kept by file are found
  // (ProcessManager::file); without it such frames are "[unknown file]".
  using FileSource = std::function<std::optional<MappedFileRef>(std::uint32_t id)>;
  void set_file_source(FileSource source);

  struct Sizes {
    std::size_t elf_files, processes, names, kernel_symbols;
    std::size_t kernel_symbol_bytes;
    UserSymbols::Refusals refused;  // files refused so far, by ElfRefusal
    UserSymbols::Held held;
    std::uint64_t table_bytes;
    // User stacks named "[mappings not read]" so far: their process was gone before its
    // mappings were read.
    std::uint64_t stacks_without_mappings;
  };
  Sizes sizes();

 private:
  void refresh_kernel();    // caller holds mutex_
  void install_captured();  // caller holds mutex_
  std::mutex mutex_;
  KernelSymbols kernel_;
  UserSymbols user_;
  // Processes captured since user_ was last used, in order: capture() takes no mutex_,
  // which an unwind holds for long.
  std::mutex captured_mutex_;
  std::vector<std::pair<std::shared_ptr<UserSymbols::Snapshot>, bool>> captured_;
  std::chrono::steady_clock::time_point kernel_read_{};
  FileSource files_;                           // under mutex_
  std::uint64_t stacks_without_mappings_ = 0;  // under mutex_
};

}  // namespace ebpf_metricsd::profiling
