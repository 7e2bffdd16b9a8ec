#pragma once
// An ELF file a process maps and the names of its addresses, read through one libdwfl session
// (DwflSession): opened once per (device, inode) by UserSymbols and kept while used.

#include <elfutils/libdwfl.h>
#include <gelf.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/symbol_index.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "text.h"

namespace ebpf_metricsd::profiling {

class ElfModule {
 public:
  // The file open as `fd` (taken), which the process maps as `path`. nullptr, with `why`
  // set, when it is refused (elf_file.h) or libdwfl cannot read it.
  static std::shared_ptr<ElfModule> open(int fd, const std::string& path, const ElfLimits& limits,
                                         UserSymbols::Held& held, ElfRefusal& why) {
    std::shared_ptr<ElfFile> file = ElfFile::open(fd, limits, why);
    if (!file) return nullptr;
    why = ElfRefusal::NotElf;
    auto m = std::shared_ptr<ElfModule>(new ElfModule(path, std::move(file), held));
    // At bias 0: the module sits at its link-time addresses, so a file offset maps to an
    // address through the program headers alone.
    m->session_ = DwflSession(*m->file_, text::base_name(path), true);
    m->mod_ = m->session_.module();
    if (!m->mod_) return nullptr;
    GElf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(m->mod_, &bias);
    if (!elf) return nullptr;
    m->bias_ = bias;
    GElf_Ehdr ehdr;
    m->fixed_ = gelf_getehdr(elf, &ehdr) && ehdr.e_type == ET_EXEC;
    std::size_t n = 0;
    if (elf_getphdrnum(elf, &n) == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD) {
          m->loads_.push_back({ph.p_offset, ph.p_filesz, ph.p_vaddr});
        }
      }
    }
    return m;
  }

  ~ElfModule() {
    held_.dwarf_bytes -= dwarf_granted_;
    held_.name_bytes -= name_bytes_;
  }
  ElfModule(const ElfModule&) = delete;
  ElfModule& operator=(const ElfModule&) = delete;

  const std::string& path() const { return path_; }
  const std::string& build_id() const { return file_->build_id(); }
  std::size_t names() const { return names_.size(); }
  std::size_t name_bytes() const { return name_bytes_; }
  const ElfFile& file() const { return *file_; }
  // When a name was last asked of it (its opening, before that).
  void used() { used_at_ = std::chrono::steady_clock::now(); }
  std::chrono::steady_clock::time_point used_at() const { return used_at_; }
  // The file's tables as read, and the symbol index built from them.
  std::uint64_t table_bytes() const {
    return file_->table_bytes() + (symbols_ ? symbols_->bytes() : 0);
  }
  void clear_names() {
    names_.clear();
    held_.name_bytes -= name_bytes_;
    name_bytes_ = 0;
  }

  // What is known of file offset `offset`: its function ("" when no symbol covers it) and,
  // once asked for with lines, its source lines.
  struct Named {
    std::string name;
    std::vector<SourceLine> lines;
    bool lines_read = false;
  };

  // The function at file offset `offset`, with its lines when `lines` (and DWARF is here
  // and fits in the budget).
  const Named& at(std::uint64_t offset, bool lines) {
    auto [it, fresh] = names_.try_emplace(offset);
    Named& n = it->second;
    GElf_Addr addr = 0;
    bool loaded = false;
    for (const Load& l : loads_) {
      if (offset < l.offset || offset >= l.offset + l.size) continue;
      addr = offset - l.offset + l.vaddr + bias_;
      loaded = true;
      break;
    }
    const std::size_t before = name_bytes_;
    if (fresh) {
      name_bytes_ += kEntryBytes;
      if (loaded) {
        if (!symbols_) symbols_.emplace(mod_);
        if (const char* name = symbols_->at(addr)) {
          // "clock_nanosleep@GLIBC_2.2.5": the symbol's version is not part of its name.
          std::string s(name);
          if (const auto v = s.find('@'); v != std::string::npos && v > 0) s.erase(v);
          n.name = demangle(s);
          name_bytes_ += n.name.size();
        }
      }
    }
    if (lines && !n.lines_read && loaded && !dwarf_broken_ && dwarf_granted()) {
      n.lines_read = true;
      if (auto found = source_lines(mod_, addr, n.name)) {
        n.lines = std::move(*found);
      } else {
        dwarf_broken_ = true;
        ++held_.dwarf_broken;
      }
      for (const SourceLine& l : n.lines)
        name_bytes_ += sizeof l + l.function.size() + l.file.size();
    }
    held_.name_bytes += name_bytes_ - before;
    return n;
  }

 private:
  ElfModule(std::string path, std::shared_ptr<ElfFile> file, UserSymbols::Held& held)
      : path_(std::move(path)), file_(std::move(file)), held_(held) {}

  // What libdw holds for a file whose DWARF it reads, beyond twice the DWARF.
  static constexpr std::uint64_t kDwarfFileBytes = 32 << 10;
  // What one cached name costs beyond its strings: the hash node and its bookkeeping.
  static constexpr std::size_t kEntryBytes = 96;

  // Whether this file's DWARF may be read: the first time, its size (in the file, or in its
  // debug file) is taken from the budget if it fits. A file with no DWARF takes nothing.
  bool dwarf_granted() {
    if (dwarf_granted_ > 0) return true;
    if (over_budget_) return false;
    // libdwfl reads the file's own DWARF where it has any (then 0 when it is not to be read,
    // elf_file.h), else its debug file's.
    std::uint64_t bytes = 0;
    if (file_->has_dwarf()) {
      bytes = file_->dwarf_bytes();
    } else if (const auto debug = file_->debug_file()) {
      bytes = debug->dwarf_bytes();
    }
    if (bytes == 0) return false;
    // What libdw builds beside the sections: 45 KiB a file was measured for 13 KiB of DWARF.
    const std::uint64_t cost = 2 * bytes + kDwarfFileBytes;
    if (cost > held_.max_dwarf_bytes || held_.dwarf_bytes > held_.max_dwarf_bytes - cost) {
      // Counted once a file; asked again only when it is opened again.
      over_budget_ = true;
      ++held_.lines_over_budget;
      return false;
    }
    held_.dwarf_bytes += cost;
    dwarf_granted_ = cost;
    return true;
  }

  struct Load {
    std::uint64_t offset, size, vaddr;
  };
  std::string path_;
  std::shared_ptr<ElfFile> file_;
  bool fixed_ = false;   // ET_EXEC
  DwflSession session_;  // after file_: ended before the file is closed
  Dwfl_Module* mod_ = nullptr;
  GElf_Addr bias_ = 0;
  std::vector<Load> loads_;
  std::optional<SymbolIndex> symbols_;  // read at the first name asked for
  std::chrono::steady_clock::time_point used_at_ = std::chrono::steady_clock::now();
  std::unordered_map<std::uint64_t, Named> names_;
  std::size_t name_bytes_ = 0;
  std::uint64_t dwarf_granted_ = 0;
  bool dwarf_broken_ = false;  // a line table could not be read: no more lines from it
  bool over_budget_ = false;   // its DWARF did not fit
  UserSymbols::Held& held_;    // what its names and DWARF count in, given back when closed
};

}  // namespace ebpf_metricsd::profiling
