#pragma once
// Unwinding a copy of a thread's user stack with the CFI of the code it runs: the registers
// and the top of the stack the kernel side copies (bpf/common/ustack.h), unwound with
// elfutils' libdwfl against the process's executable files at their load addresses, as
// `perf record --call-graph dwarf` does. Where a file has no CFI, libdwfl follows the frame
// pointer.

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/profile/elf_file.h"

struct Dwfl;

namespace ebpf_metricsd::profiling {

// The user registers in DWARF order (x86-64: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp,
// r8..r15, rip) and the bytes copied from `base` up.
struct UserStackCopy {
  static constexpr std::size_t kRegs = 17;
  static constexpr std::size_t kSp = 7, kIp = 16;
  std::array<std::uint64_t, kRegs> regs{};
  std::uint64_t base = 0;
  std::span<const std::uint8_t> bytes;
};

// Why an unwind ended. Complete: the stack's own end (the return address undefined, as at
// `_start` and `clone3`). The others cut it, keeping the frames found before.
enum class UnwindEnd {
  Complete,
  StackCopyEnd,  // it needed memory beyond the bytes copied
  NoCfi,         // no CFI for an address, and no frame pointer to follow
  NoModule,      // an address in no file the process maps
  Depth,         // deeper than the limit
  Loop,          // a frame repeated (pc and stack pointer): unwinding went astray
};
std::string_view unwind_end_name(UnwindEnd end);
inline constexpr UnwindEnd kUnwindEnds[] = {UnwindEnd::Complete, UnwindEnd::StackCopyEnd,
                                            UnwindEnd::NoCfi,    UnwindEnd::NoModule,
                                            UnwindEnd::Depth,    UnwindEnd::Loop};

struct UnwoundFrame {
  std::uint64_t pc;
  // Where the thread was (the first frame, or one a signal interrupted): looked up as is;
  // otherwise a return address, looked up one byte before.
  bool activation;
};
struct Unwound {
  std::vector<UnwoundFrame> frames;
  UnwindEnd end = UnwindEnd::Complete;
};

// An executable file of a process as it maps it: its range, the offset of the mapping in
// the file, the file's program headers' view (for the load bias) and the checked file
// (shared: every address space that maps it reads the same copy of its CFI).
struct MappedFile {
  std::uint64_t start = 0, offset = 0;
  std::string name;
  std::shared_ptr<const ElfFile> file;
  bool fixed = false;  // ET_EXEC: at its link-time addresses whatever the mapping says
  // The PT_LOAD segment that holds `offset`: its offset and address in the file.
  std::uint64_t segment_offset = 0, segment_vaddr = 0;
};

// One process's address space as libdwfl sees it, built once from its mappings.
class AddressSpace {
 public:
  // nullptr when libdwfl takes none of the files.
  static std::unique_ptr<AddressSpace> build(pid_t tgid, std::span<const MappedFile> files);
  ~AddressSpace();
  AddressSpace(const AddressSpace&) = delete;
  AddressSpace& operator=(const AddressSpace&) = delete;

  // Unwinds thread `tid`'s copied stack, at most `max_depth` frames. Not thread-safe.
  Unwound unwind(pid_t tid, const UserStackCopy& copy, std::size_t max_depth);

 private:
  AddressSpace() = default;
  struct Reads;
  Dwfl* dwfl_ = nullptr;
  std::unique_ptr<Reads> reads_;  // the sample being unwound: libdwfl's callbacks read it
  std::vector<std::shared_ptr<const ElfFile>> files_;  // what libdwfl's modules read
};

}  // namespace ebpf_metricsd::profiling
