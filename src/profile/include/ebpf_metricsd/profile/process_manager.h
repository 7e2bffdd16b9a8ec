#pragma once
// The processes the walk of user stacks in the kernel meets, their mappings and the files
// they map, for every tracer that walks (bpf/common/unwind.bpf.h).
//
// A walk that meets a process the daemon has not read, or whose code changed since, asks for
// it through a ring (emd_unwind_wants); a walk that reaches a file whose table is not loaded
// yet asks for that file. Two threads answer:
// - the process thread reads the process's mappings (/proc/PID/maps), gives each file it maps
//   an id (one per build ID, or per file where there is none), writes the mappings into the
//   trie and settles the process; it reads a process again at once where the kernel saw its
//   code change, and with a growing pause (10 ms doubling to 10 s) where a walk found an
//   address in no file (code of a JIT) and reading found nothing new; every 5 s it forgets
//   the processes that have exited and drops the tables no process maps any more;
// - the table thread compiles each new file's table (unwind_table.h) and loads it, the
//   files walks are waiting for first.

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ebpf_metricsd/bpf/ring_reader.h"
#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/proc_files.h"
#include "ebpf_metricsd/profile/unwind_maps.h"
#include "ebpf_metricsd/profile/unwind_table.h"

struct bpf_object;
struct bpf_map;
struct bpf_program;

namespace ebpf_metricsd::profiling {

// How a file's table came out (ebpf_metricsd_profile_unwind_tables_total{result}).
enum class TableResult {
  Loaded,
  NoCfi,
  BadCfi,
  TooLarge,
  TooSlow,
  Unreadable,  // the file could not be opened or was refused (elf_file.h)
  RowsFull,    // the row array had no room
  RulesFull,
  PagesFull,
};
inline constexpr std::array kTableResults = {
    TableResult::Loaded,   TableResult::NoCfi,     TableResult::BadCfi,
    TableResult::TooLarge, TableResult::TooSlow,   TableResult::Unreadable,
    TableResult::RowsFull, TableResult::RulesFull, TableResult::PagesFull};
std::string_view table_result_name(TableResult r);

class ProcessManager {
 public:
  struct Options {
    UnwindMapLimits maps;
    UnwindTableLimits tables;
    ElfLimits files;
    std::chrono::seconds forget_every{5};
    // How long a table no process maps is kept (a program run again and again reuses it).
    std::chrono::seconds keep_unused{10};
  };
  // Makes the maps (throws BpfError) and starts the threads.
  explicit ProcessManager(Options options);
  ~ProcessManager();
  ProcessManager(const ProcessManager&) = delete;
  ProcessManager& operator=(const ProcessManager&) = delete;

  // Before `obj` loads: its walker maps are the shared ones.
  void share(bpf_object* obj) const { maps_.share(obj); }

  struct Counts {
    std::array<std::uint64_t, kTableResults.size()> tables{};
    std::uint64_t processes_read = 0;   // reads of a process's mappings
    std::uint64_t reads_unchanged = 0;  // of them, reads that found what the last one did
    std::uint64_t mappings_full = 0;    // reads whose blocks did not all fit in the trie
    std::uint64_t processes = 0;        // known now
    std::uint64_t files = 0;            // with an id now
    double build_seconds = 0;           // building tables, in all
    UnwindMaps::Usage usage;
    std::uint64_t kernel_bytes = 0;
  };
  Counts counts() const;

  // The file the walk named frames by as `id` (EMD_UNWIND_FILE_FRAME): a descriptor of its own
  // (the caller closes it) while the file is known, for as long as frames can name it (ids
  // are reused a minute after their file was dropped). nullopt where it is not known.
  std::optional<MappedFileRef> file(std::uint32_t id) const;

  // Waits until the threads have answered every ask made before the call and built every
  // table queued (tests; benchmarks). False after `timeout`.
  bool settle(std::chrono::milliseconds timeout);

 private:
  struct Load {
    std::uint64_t offset = 0, vaddr = 0, filesz = 0;
  };
  struct File {
    std::uint32_t id = 0;
    std::string key;  // "b:<build id>" or "i:<dev>:<inode>:<size>:<mtime>"
    std::uint64_t dev = 0, inode = 0;
    std::string path;              // as the process that first mapped it named it
    int fd = -1;                   // for the symbolizer (file()), while it is known
    std::shared_ptr<ElfFile> elf;  // until its table is built
    bool fixed = false;            // ET_EXEC: at its link-time addresses
    std::vector<Load> loads;
    unsigned refs = 0;
    std::chrono::steady_clock::time_point unused_since{};
  };
  struct Process {
    std::uint64_t start_time = 0;
    std::vector<MappedRange> ranges;
    std::set<std::uint32_t> files;
    std::uint32_t settled_gen = 0;
    bool settled = false;
    std::uint64_t epoch = 0;   // of its last settlement (UnwindMaps::settle)
    bool short_write = false;  // its last blocks did not all fit in the trie
    std::chrono::steady_clock::time_point read_at{};
    std::chrono::milliseconds pause{0};
  };

  void on_want(const emd_unwind_want& want);
  void process_loop();
  void table_loop();
  // Reads process tgid's mappings and settles it (unless it was read lately and nothing
  // changed since).
  void read_process(pid_t tgid);
  // The id of the file mapping `m` maps (0: none opens), and its load bias.
  std::uint32_t file_for(pid_t tgid, const MapsLine& m, std::uint64_t& bias);
  void unref(std::uint32_t id);
  // The id of the vDSO's table (0: none), made at its first use.
  std::uint32_t vdso_file();
  void forget_exited();
  // Forgets process tgid where it is no longer the process that was read (gone, or its pid
  // reused).
  void forget_if_gone(pid_t tgid);

  Options options_;
  UnwindMaps maps_;
  mutable std::mutex mutex_;  // everything below
  std::condition_variable wake_process_, wake_table_, idle_;
  std::deque<pid_t> wanted_;
  std::deque<pid_t> exited_;  // leaders that exited: forgotten at once
  std::set<pid_t> wanted_set_;
  std::deque<std::uint32_t> queued_;  // files to build, first first
  std::uint32_t building_ = 0;        // the file being built (0: none)
  std::map<pid_t, Process> processes_;
  std::map<std::uint32_t, File> files_;
  std::map<std::string, std::uint32_t> by_key_;    // build ID or inode key -> id
  std::map<std::string, std::uint32_t> by_inode_;  // inode key -> id (an alias of by_key_)
  std::uint32_t next_id_ = 1;
  // Ids of dropped files, reusable from when (a frame names its file by id until it is
  // symbolized: at the next read of the kernel side, or at once for a slow event).
  std::deque<std::pair<std::uint32_t, std::chrono::steady_clock::time_point>> retired_ids_;
  static constexpr std::chrono::seconds kIdGrace{60};
  std::uint32_t new_id();  // caller holds mutex_; 0 when every id is taken
  std::uint32_t vdso_id_ = 0;
  bool vdso_tried_ = false;
  Counts counts_;
  bool stopping_ = false;
  std::uint64_t asks_ = 0, answered_ = 0;
  std::thread process_thread_, table_thread_;
  RingReader wants_;  // last: stops first
};

// The daemon's walk of user stacks: its ProcessManager, made when the first tracer that walks
// starts (its maps cost memory: a daemon whose tracers walk nothing makes none) and kept for
// the daemon's life, across reloads (the tables stay loaded).
class Walker {
 public:
  explicit Walker(ProcessManager::Options options = {}) : options_(options) {}
  // Throws BpfError where the kernel refuses the maps.
  ProcessManager& get();
  // The rows of the tables (`profiles.unwind_table_rows`): for the maps made from now on; a
  // change once they are made takes effect at the next start (logged).
  void set_rows(std::uint32_t rows);

 private:
  std::mutex mutex_;
  ProcessManager::Options options_;
  std::unique_ptr<ProcessManager> manager_;
};

// The label value of a walk's end (enum emd_unwind_end).
std::string_view walk_end_name(std::uint32_t end);

// After load: puts walker program `prog` at index 0 of prog array `walkers`, where it was
// loaded (nothing where it was not: another hook kind's). Throws BpfError.
void set_walker(bpf_map* walkers, bpf_program* prog);

// How the walks of an object ended since the last call, by enum emd_unwind_end, from its
// per-CPU counts (emd_unwind_ends); `seen` keeps the totals read so far.
using WalkEnds = std::array<std::uint64_t, EMD_UNWIND_END__COUNT>;
WalkEnds walk_ends_since(const bpf_map* ends, WalkEnds& seen);

}  // namespace ebpf_metricsd::profiling
