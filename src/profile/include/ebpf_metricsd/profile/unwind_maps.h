#pragma once
// The maps the walk of user stacks in the kernel reads (bpf/common/unwind.h), made once by the
// daemon and given to every BPF object that walks, and what is written into them: each file's
// unwind table (rows in one array, reused after a grace once the file is dropped; rules kept
// once for all files), each process's mappings as blocks of an LPM trie, and the state of both.

#include <linux/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "common/unwind.h"
#include "ebpf_metricsd/profile/unwind_table.h"

struct bpf_object;

namespace ebpf_metricsd::profiling {

struct UnwindMapLimits {
  std::uint32_t mapping_blocks = 1u << 18;  // trie entries over all processes
  std::uint32_t processes = 1u << 14;
  std::uint32_t files = 1u << 12;
  std::uint32_t pages = 1u << 14;
  std::uint32_t rows = 1u << 20;  // 4 bytes each, two to an array element; a file half at most
  std::uint32_t rules = 1u << 14;
  std::uint32_t wants_bytes = 1u << 16;
};

// A process's mapping of a file, as the trie keeps it.
struct MappedRange {
  std::uint64_t start = 0, end = 0;
  std::uint32_t file = 0;      // 0: not code
  std::uint64_t bias = 0;      // the file's address = the address - bias
  std::uint64_t off_bias = 0;  // the offset in the file = the address - off_bias
  auto operator<=>(const MappedRange&) const = default;
};

// The trie's blocks for [start, end) of process tgid: the aligned power-of-two blocks that
// cover it exactly, largest first.
std::vector<emd_unwind_map_key> mapping_blocks(std::uint32_t tgid, std::uint64_t start,
                                               std::uint64_t end);

class UnwindMaps {
 public:
  // Makes the maps; throws BpfError with the kernel's reason when it refuses one.
  explicit UnwindMaps(const UnwindMapLimits& limits);
  ~UnwindMaps();
  UnwindMaps(const UnwindMaps&) = delete;
  UnwindMaps& operator=(const UnwindMaps&) = delete;

  // Before `obj` is loaded: its walker maps (those common/unwind.bpf.h declares but its
  // own emd_unwind_ends) are these. Throws BpfError.
  void share(bpf_object* obj) const;
  int wants_fd() const { return wants_; }

  // A file's table, written in the order a walk reads it (rows and rules, then pages, then
  // the file's state), so that a walk never reads a half-written table.
  enum class Loaded { Ok, RowsFull, RulesFull, PagesFull };
  Loaded load(std::uint32_t file, const UnwindTable& table);
  // The file's state without a table (loading, refused).
  void set_state(std::uint32_t file, std::uint32_t state);
  // The file is no longer mapped by any process: its state and pages go now, its rows are
  // reused once no walk can be reading them (kGrace). Only then: the walk's frame cache keeps
  // a file's id and rules for as long as a settlement of a process that maps it holds,
  // without looking at the file's state again.
  void unload(std::uint32_t file);
  static constexpr std::chrono::seconds kGrace{2};

  // Process tgid's mappings: writes the blocks of `now` that `before` does not have as they
  // are and deletes the others of `before`; with `rewrite` (the last write fell short),
  // deletes all of `before` and writes all of `now`. False when the trie had no room for some
  // (they are missing: walks there end as no_mapping, and the next read rewrites).
  bool write_mappings(std::uint32_t tgid, const std::vector<MappedRange>& before,
                      const std::vector<MappedRange>& now, bool rewrite = false);
  // The file a walk finds at address addr of process tgid (the trie's longest match): 0 where
  // there is none, or it is not code.
  std::uint32_t file_at(std::uint32_t tgid, std::uint64_t addr) const;
  // The kernel's record of process tgid (a walk made it); false when there is none.
  bool proc(std::uint32_t tgid, emd_unwind_proc& out) const;
  // Settles process tgid as `s` says, under `epoch`, or where that is 0 an epoch of its own
  // (never given before); returns the epoch. The walk's frame cache holds an address's file
  // and rule for an epoch: one is given again only to the same process with the same
  // mappings of the same files.
  std::uint64_t settle(std::uint32_t tgid, emd_unwind_settled s, std::uint64_t epoch = 0);
  // Forgets process tgid: its record, its settlement.
  void forget(std::uint32_t tgid);

  struct Usage {
    std::uint64_t rows = 0, rows_retired = 0, rules = 0, pages = 0;  // rules: in use
  };
  Usage usage() const;
  // The memory the kernel charges for the maps (their memlock), in bytes.
  std::uint64_t kernel_bytes() const;

 private:
  // Rows: extents of the row array, free or retired (freed after kGrace).
  std::uint32_t take_rows(std::uint32_t n);  // the first row, or UINT32_MAX
  void give_rows(std::uint32_t first, std::uint32_t n);
  void reclaim();

  UnwindMapLimits limits_;
  // Every map: its name in the walker's objects and its descriptor.
  struct NamedMap {
    const char* name;
    int fd;
  };
  std::array<NamedMap, 9> maps() const {
    return {{{"emd_unwind_mappings", mappings_},
             {"emd_unwind_procs", procs_},
             {"emd_unwind_settled", settled_},
             {"emd_unwind_files", files_},
             {"emd_unwind_pages", pages_},
             {"emd_unwind_rows", rows_},
             {"emd_unwind_rules", rules_},
             {"emd_unwind_wants", wants_},
             {"emd_unwind_version", version_}}};
  }
  // Bumps emd_unwind_version: after a process's settlement changed (a sample walk's memo of
  // its process check holds while the number stays).
  void bump_version();

  int mappings_ = -1, procs_ = -1, settled_ = -1, files_ = -1, pages_ = -1, rows_ = -1, rules_ = -1,
      wants_ = -1, version_ = -1;
  std::uint64_t* version_word_ = nullptr;  // emd_unwind_version's, mapped
  mutable std::mutex mutex_;
  std::map<std::uint32_t, std::uint32_t> free_;  // first row -> count
  struct Retired {
    std::uint32_t first, count;
    std::chrono::steady_clock::time_point at;
  };
  std::deque<Retired> retired_;
  struct Table {
    std::uint32_t first = 0, count = 0;
    std::vector<emd_unwind_page_key> pages;
    std::vector<UnwindRule> rules;  // those its rows use, each once
  };
  std::map<std::uint32_t, Table> tables_;  // by file
  // The rules of the loaded tables, by how many use each; an index no table uses is free
  // once no walk can be reading it (kGrace).
  struct RuleUse {
    std::uint16_t index = 0;
    std::uint32_t refs = 0;
  };
  std::map<UnwindRule, RuleUse> rule_index_;
  std::vector<std::uint16_t> free_rules_;
  std::deque<std::pair<std::uint16_t, std::chrono::steady_clock::time_point>> retired_rules_;
  std::uint32_t next_rule_ = 0;           // the first index never used
  std::atomic<std::uint64_t> epochs_{0};  // settlements made
};

}  // namespace ebpf_metricsd::profiling
