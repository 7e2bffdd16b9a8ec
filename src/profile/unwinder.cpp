#include "ebpf_metricsd/profile/unwinder.h"

#include <dwarf.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <utility>

namespace ebpf_metricsd::profiling {

std::string_view unwind_end_name(UnwindEnd end) {
  switch (end) {
    case UnwindEnd::Complete:
      return "complete";
    case UnwindEnd::StackCopyEnd:
      return "stack_copy_end";
    case UnwindEnd::NoCfi:
      return "no_cfi";
    case UnwindEnd::NoModule:
      return "no_module";
    case UnwindEnd::Depth:
      return "depth";
    case UnwindEnd::Loop:
      return "loop";
  }
  return "?";
}

namespace {

// libdwfl takes the architecture's backend from an ELF it is given at attach time, and uses
// it for as long as the Dwfl lives: a header of an x86-64 ELF file, which lives as long as
// the process.
Elf* architecture_elf() {
  static Elf64_Ehdr header = [] {
    Elf64_Ehdr h{};
    std::memcpy(h.e_ident, ELFMAG, SELFMAG);
    h.e_ident[EI_CLASS] = ELFCLASS64;
    h.e_ident[EI_DATA] = ELFDATA2LSB;
    h.e_ident[EI_VERSION] = EV_CURRENT;
    h.e_type = ET_EXEC;
    h.e_machine = EM_X86_64;
    h.e_version = EV_CURRENT;
    h.e_ehsize = sizeof h;
    return h;
  }();
  static Elf* const elf = [] {
    elf_version(EV_CURRENT);
    return elf_memory(reinterpret_cast<char*>(&header), sizeof header);
  }();
  return elf;
}

}  // namespace

// What libdwfl's callbacks read: the sample being unwound, and what its reads ran into.
struct AddressSpace::Reads {
  pid_t tgid = 0;
  const UserStackCopy* copy = nullptr;
  bool past_copy = false;  // a read above the bytes copied
  bool elsewhere = false;  // a read below them, or of memory not on the stack

  static pid_t next_thread(Dwfl*, void* arg, void** thread_arg) {
    auto* self = static_cast<Reads*>(arg);
    if (*thread_arg) return 0;
    *thread_arg = self;
    return self->tgid;
  }
  static bool get_thread(Dwfl*, pid_t, void* arg, void** thread_arg) {
    *thread_arg = arg;
    return true;
  }
  static bool memory_read(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
    auto* self = static_cast<Reads*>(arg);
    const UserStackCopy& c = *self->copy;
    const std::size_t n = c.bytes.size();
    if (n >= 8 && addr >= c.base && addr - c.base <= n - 8) {
      std::memcpy(result, c.bytes.data() + (addr - c.base), 8);
      return true;
    }
    (addr >= c.base + n ? self->past_copy : self->elsewhere) = true;
    return false;
  }
  static bool set_initial_registers(Dwfl_Thread* thread, void* thread_arg) {
    const auto* self = static_cast<Reads*>(thread_arg);
    return dwfl_thread_state_registers(thread, 0, UserStackCopy::kRegs, self->copy->regs.data());
  }
};

std::unique_ptr<AddressSpace> AddressSpace::build(pid_t tgid, std::span<const MappedFile> files) {
  std::unique_ptr<AddressSpace> space(new AddressSpace());
  space->reads_ = std::make_unique<Reads>();
  space->reads_->tgid = tgid;
  // CFI comes from the checked files themselves and nothing else: no separate debug files
  // are looked for (where CFI is only in .debug_frame of a separate file, the frame pointer
  // serves).
  space->dwfl_ = dwfl_begin(&dwfl_callbacks(false));
  if (!space->dwfl_) return nullptr;
  dwfl_report_begin(space->dwfl_);
  std::size_t reported = 0;
  for (const MappedFile& f : files) {
    if (!f.file) continue;
    // Where the file's addresses land: for ET_DYN the mapping's start less the offset of the
    // segment it maps (and that segment's address in the file); ET_EXEC is not moved.
    // libdwfl takes the bias as the module's low address less the file's (ElfFile::low).
    const std::uint64_t bias =
        f.fixed ? 0 : f.start - f.offset - (f.segment_vaddr - f.segment_offset);
    if (!f.file->report(space->dwfl_, f.name, bias)) continue;
    space->files_.push_back(f.file);
    ++reported;
  }
  dwfl_report_end(space->dwfl_, nullptr, nullptr);
  if (reported == 0) return nullptr;
  static const Dwfl_Thread_Callbacks callbacks = {
      Reads::next_thread,           Reads::get_thread, Reads::memory_read,
      Reads::set_initial_registers, nullptr,           nullptr};
  if (!dwfl_attach_state(space->dwfl_, architecture_elf(), tgid, &callbacks, space->reads_.get()))
    return nullptr;
  return space;
}

AddressSpace::~AddressSpace() {
  if (dwfl_) dwfl_end(dwfl_);
}

namespace {

struct Walk {
  Dwfl* dwfl;
  std::size_t max_depth;
  Unwound* out;
  std::set<std::pair<Dwarf_Addr, Dwarf_Word>> seen;  // (pc, sp) of every frame
  bool depth = false, loop = false;
};

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto* w = static_cast<Walk*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  Dwarf_Word sp = 0;
  if (dwfl_frame_reg(frame, UserStackCopy::kSp, &sp) == 0 && !w->seen.insert({pc, sp}).second) {
    w->loop = true;
    return DWARF_CB_ABORT;
  }
  if (w->out->frames.size() >= w->max_depth) {
    w->depth = true;
    return DWARF_CB_ABORT;
  }
  w->out->frames.push_back({pc, activation});
  return DWARF_CB_OK;
}

}  // namespace

Unwound AddressSpace::unwind(pid_t tid, const UserStackCopy& copy, std::size_t max_depth) {
  Unwound out;
  reads_->copy = &copy;
  reads_->past_copy = reads_->elsewhere = false;
  Walk walk{dwfl_, max_depth, &out, {}};
  const int rc = dwfl_getthread_frames(dwfl_, tid, on_frame, &walk);
  reads_->copy = nullptr;
  if (walk.depth) {
    out.end = UnwindEnd::Depth;
  } else if (walk.loop) {
    out.end = UnwindEnd::Loop;
  } else if (reads_->past_copy || reads_->elsewhere) {
    // A read of memory not copied makes the return address unknown, which libdwfl reports
    // as the stack's end: only the reads tell.
    out.end = UnwindEnd::StackCopyEnd;
  } else if (rc == 0) {
    out.end = UnwindEnd::Complete;
  } else if (!out.frames.empty() &&
             !dwfl_addrmodule(dwfl_,
                              out.frames.back().pc - (out.frames.back().activation ? 0 : 1))) {
    out.end = UnwindEnd::NoModule;
  } else {
    out.end = UnwindEnd::NoCfi;
  }
  return out;
}

}  // namespace ebpf_metricsd::profiling
