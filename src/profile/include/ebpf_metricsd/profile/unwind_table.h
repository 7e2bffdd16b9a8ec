#pragma once
// An executable file's CFI compiled into the table the kernel side walks user stacks with
// (bpf/common/unwind_table.h): for each address range, how to find the canonical frame
// address and where the return address and the caller's frame pointer were saved.
//
// The CFI is read by libdw: its FDEs are listed from `.eh_frame` (or, where a file has none,
// `.debug_frame`), and each row of each FDE is what libdw's own interpreter finds there
// (dwarf_cfi_addrframe), classified into the few forms the walk follows. What is parsed here
// is the list of FDEs (their start and length, encoded as their CIE says); it is bounded and
// fuzzed with the rest of a user's file (tests/fuzz).

#include <elfutils/libdw.h>
#include <linux/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "common/unwind_table.h"
#include "ebpf_metricsd/profile/elf_file.h"

namespace ebpf_metricsd::profiling {

// One rule, as the kernel keeps it (emd_unwind_rule without padding).
struct UnwindRule {
  std::uint8_t kind = EMD_UNWIND_NONE;   // emd_unwind_kind
  std::uint8_t fp = EMD_UNWIND_FP_SAME;  // emd_unwind_fp
  std::uint8_t plt_threshold = 0;
  std::int32_t cfa_offset = 0;
  std::int32_t fp_offset = 0;
  std::int32_t ra_offset = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const UnwindRule&) const = default;
  emd_unwind_rule kernel() const;
};

struct UnwindTableLimits {
  std::size_t max_fdes = 1u << 20;
  std::size_t max_rows = 4u << 20;  // rows of libdw's interpreter, before merging
  std::chrono::milliseconds max_time{10000};
};

// Why a file has no table.
enum class UnwindTableRefusal {
  NoCfi,     // neither .eh_frame nor .debug_frame (or no FDE in them)
  BadCfi,    // its CFI could not be read at all
  TooLarge,  // more FDEs or rows than the limits
  TooSlow,   // building took longer than the limit
};
std::string_view unwind_table_refusal_name(UnwindTableRefusal why);

struct UnwindTable {
  struct Row {
    std::uint16_t lo = 0;
    std::uint16_t rule = 0;  // index into rules
  };
  struct Page {
    std::uint32_t page = 0;   // address >> EMD_UNWIND_PAGE_BITS
    std::uint32_t first = 0;  // index into rows
    std::uint32_t count = 0;
  };
  std::vector<UnwindRule> rules;  // distinct, this file's
  std::vector<Row> rows;          // by page, sorted by lo within each
  std::vector<Page> pages;        // sorted by page
  // Whether its code keeps rbp as a frame pointer (most of its functions compute the CFA
  // from rbp): where an address has no rule, the walk may follow the frame pointer.
  bool frame_pointers = false;
  // What was read: FDEs taken, FDEs skipped as unreadable (a bad encoding, a range past the
  // address space, one libdw could not interpret: the rest of it has no rule), rows of
  // forms the walk does not follow.
  std::size_t fdes = 0, bad_fdes = 0, unsupported_rows = 0;
  bool debug_frame = false;  // read from .debug_frame (no .eh_frame)

  // The rule for file address `addr` (NONE where no CFI covers it).
  UnwindRule find(std::uint64_t addr) const;
  // Bytes the kernel keeps for this table: its rows and page entries (rules are shared).
  std::size_t kernel_bytes() const;
};

// Builds the table of `file`'s CFI. nullopt, with `why`, when it has none to give.
std::optional<UnwindTable> build_unwind_table(const ElfFile& file, const UnwindTableLimits& limits,
                                              UnwindTableRefusal& why);

// The rule libdw's interpreter gives for address `addr` of a CFI (the classification the
// table is built with): NONE where no FDE covers it. For tests, which compare every address.
UnwindRule unwind_rule_at(Dwarf_CFI* cfi, std::uint64_t addr);

}  // namespace ebpf_metricsd::profiling
