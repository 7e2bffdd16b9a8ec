#include "ebpf_metricsd/profile/elf_file.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace ebpf_metricsd::profiling {

std::string_view elf_refusal_name(ElfRefusal why) {
  switch (why) {
    case ElfRefusal::NotRegular:
      return "not_regular";
    case ElfRefusal::TooLarge:
      return "too_large";
    case ElfRefusal::NotElf:
      return "not_elf";
    case ElfRefusal::BadTables:
      return "bad_tables";
    case ElfRefusal::TooManySymbols:
      return "too_many_symbols";
    case ElfRefusal::Unreadable:
      return "unreadable";
  }
  return "?";
}

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string s(out);
  std::free(out);
  return s;
}

namespace {

// Whether [offset, offset + size) lies inside a file of `file_size` bytes.
bool inside(std::uint64_t offset, std::uint64_t size, std::uint64_t file_size) {
  return offset <= file_size && size <= file_size - offset;
}

// Checks the tables of `elf` (ELF_C_READ: the ones it reads are copies in memory) against the
// file's size; sets `low`/`high` as libdwfl places the file at bias 0.
// A debug file keeps the program headers of the file it was split from, whose bytes it does
// not hold: its segments are not checked against its size.
bool check_tables(int fd, Elf* elf, std::uint64_t file_size, const ElfLimits& limits, bool debug,
                  ElfRefusal& why, std::uint64_t& low, std::uint64_t& high) {
  GElf_Ehdr eh;
  if (elf_kind(elf) != ELF_K_ELF || !gelf_getehdr(elf, &eh) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64 ||
      (eh.e_type != ET_EXEC && eh.e_type != ET_DYN)) {
    why = ElfRefusal::NotElf;
    return false;
  }
  why = ElfRefusal::BadTables;
  std::size_t phnum = 0, shnum = 0, shstrndx = 0;
  if (elf_getphdrnum(elf, &phnum) != 0 || elf_getshdrnum(elf, &shnum) != 0) return false;
  if (phnum > 0 && (eh.e_phentsize != sizeof(Elf64_Phdr) ||
                    !inside(eh.e_phoff, phnum * sizeof(Elf64_Phdr), file_size))) {
    return false;
  }
  // libelf counts no sections where it cannot read the table: the header says there is one.
  if (eh.e_shoff != 0 && shnum == 0) return false;
  if (shnum > 0 && (eh.e_shentsize != sizeof(Elf64_Shdr) ||
                    !inside(eh.e_shoff, shnum * sizeof(Elf64_Shdr), file_size) ||
                    elf_getshdrstrndx(elf, &shstrndx) != 0 || shstrndx >= shnum)) {
    return false;
  }
  bool loads = false;
  for (std::size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) return false;
    if (ph.p_type != PT_LOAD) continue;
    // Every segment inside a user address space (57 bits with five-level paging).
    constexpr std::uint64_t kUserTop = std::uint64_t{1} << 56;
    if ((!debug && !inside(ph.p_offset, ph.p_filesz, file_size)) || ph.p_memsz < ph.p_filesz ||
        ph.p_vaddr >= kUserTop || ph.p_memsz > kUserTop - ph.p_vaddr) {
      return false;
    }
    if (!loads) low = ph.p_vaddr & -ph.p_align;  // libdwfl's rounding, p_align 0 included
    high = std::max(loads ? high : 0, ph.p_vaddr + ph.p_memsz);
    loads = true;
  }
  if (!loads || high <= low) return false;
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) return false;
    if (sh.sh_link >= shnum && sh.sh_link < SHN_LORESERVE) return false;
    if (sh.sh_type == SHT_NOBITS) continue;
    if (!inside(sh.sh_offset, sh.sh_size, file_size)) return false;
    if (sh.sh_flags & SHF_COMPRESSED) {
      // Only debug sections are compressed by real toolchains (libelf leaks the inflated
      // copy of a compressed string table); what it says it holds once inflated, libelf
      // would allocate.
      if (sh.sh_type != SHT_PROGBITS || (sh.sh_flags & SHF_ALLOC)) return false;
      Elf64_Chdr ch;
      if (sh.sh_size < sizeof ch ||
          pread(fd, &ch, sizeof ch, static_cast<off_t>(sh.sh_offset)) !=
              static_cast<ssize_t>(sizeof ch) ||
          ch.ch_size > limits.max_inflated) {
        return false;
      }
    }
    if (sh.sh_type == SHT_STRTAB) {
      // A string table ends with a NUL: libelf looks for one past every name it reads (and
      // leaks the section's copy where there is none).
      char last = 1;
      if (sh.sh_size == 0 ||
          pread(fd, &last, 1, static_cast<off_t>(sh.sh_offset + sh.sh_size - 1)) != 1 ||
          last != 0) {
        return false;
      }
    }
    if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) {
      if (sh.sh_entsize != sizeof(Elf64_Sym)) return false;
      if (sh.sh_size / sizeof(Elf64_Sym) > limits.max_symbols) {
        why = ElfRefusal::TooManySymbols;
        return false;
      }
    }
  }
  return true;
}

// The bytes of the DWARF sections of a checked file, inflated (`dwarf`), and of the tables
// symbolizing and unwinding read: symbols, their strings and the CFI (`tables`). `dwarf` is
// 0 where its DWARF is not to be read for lines: libdw reads a name of a string section up to
// its NUL, past the section's end where it has none (found by the fuzz target), so each must
// end with one; a compressed one cannot be looked at before it is inflated, so it is taken
// only from a file of the root-owned debug tree (`debug`).
void section_sizes(int fd, Elf* elf, bool debug, std::uint64_t& dwarf, std::uint64_t& tables,
                   bool& has_dwarf) {
  std::size_t shstrndx = 0;
  dwarf = tables = 0;
  has_dwarf = false;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return;
  bool usable = true;
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS) continue;
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    if (!name) continue;
    const bool gnu_compressed = std::strncmp(name, ".zdebug_", 8) == 0;
    const char* dwarf_name = gnu_compressed ? name + 2 : name + 1;  // "debug_..."
    if ((std::strncmp(name, ".debug_", 7) == 0 || gnu_compressed) &&
        (std::strcmp(dwarf_name, "debug_info") == 0 || std::strcmp(dwarf_name, "debug_line") == 0))
      has_dwarf = true;
    if ((std::strncmp(name, ".debug_", 7) == 0 || gnu_compressed) &&
        (std::strcmp(dwarf_name, "debug_str") == 0 ||
         std::strcmp(dwarf_name, "debug_line_str") == 0)) {
      char last = 1;
      if ((sh.sh_flags & SHF_COMPRESSED) || gnu_compressed) {
        usable = usable && debug;
      } else if (sh.sh_size == 0 ||
                 pread(fd, &last, 1, static_cast<off_t>(sh.sh_offset + sh.sh_size - 1)) != 1 ||
                 last != 0) {
        usable = false;
      }
    }
    if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM || sh.sh_type == SHT_STRTAB ||
        std::strncmp(name, ".eh_frame", 9) == 0 || std::strcmp(name, ".debug_frame") == 0) {
      tables += sh.sh_size;
    }
    if (std::strncmp(name, ".debug_", 7) != 0 && std::strncmp(name, ".zdebug_", 8) != 0) continue;
    std::uint64_t size = sh.sh_size;
    Elf64_Chdr ch;
    if ((sh.sh_flags & SHF_COMPRESSED) &&
        pread(fd, &ch, sizeof ch, static_cast<off_t>(sh.sh_offset)) ==
            static_cast<ssize_t>(sizeof ch)) {
      size = ch.ch_size;
    } else if (name[1] == 'z') {
      size *= 8;  // GNU-compressed: no size said up front
    }
    dwarf += size;
  }
  if (!usable) dwarf = 0;
}

}  // namespace

std::shared_ptr<ElfFile> ElfFile::open(int fd, const ElfLimits& limits, ElfRefusal& why,
                                       bool debug) {
  if (fd < 0) {
    why = ElfRefusal::Unreadable;
    return nullptr;
  }
  std::shared_ptr<ElfFile> f(new ElfFile());
  f->limits_ = limits;
  f->fd_ = fd;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    why = ElfRefusal::Unreadable;
    return nullptr;
  }
  if (!S_ISREG(st.st_mode)) {
    why = ElfRefusal::NotRegular;
    return nullptr;
  }
  f->size_ = static_cast<std::uint64_t>(st.st_size);
  if (f->size_ > limits.max_file_size) {
    why = ElfRefusal::TooLarge;
    return nullptr;
  }
  unsigned char ident[EI_NIDENT] = {};
  if (pread(fd, ident, sizeof ident, 0) != static_cast<ssize_t>(sizeof ident) ||
      std::memcmp(ident, ELFMAG, SELFMAG) != 0) {
    why = ElfRefusal::NotElf;
    return nullptr;
  }
  static const unsigned version = elf_version(EV_CURRENT);
  (void)version;
  f->elf_ = elf_begin(fd, ELF_C_READ, nullptr);
  if (!f->elf_) {  // an ELF file whose tables libelf could not read
    why = ElfRefusal::BadTables;
    return nullptr;
  }
  if (!check_tables(fd, f->elf_, f->size_, limits, debug, why, f->low_, f->high_)) {
    return nullptr;
  }
  section_sizes(fd, f->elf_, debug, f->dwarf_bytes_, f->table_bytes_, f->has_dwarf_);
  const void* bits = nullptr;
  const ssize_t len = dwelf_elf_gnu_build_id(f->elf_, &bits);
  for (ssize_t i = 0; i < len && i < 64; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", static_cast<const unsigned char*>(bits)[i]);
    f->build_id_ += b;
  }
  return f;
}

ElfFile::~ElfFile() {
  if (elf_) elf_end(elf_);
  if (fd_ >= 0) close(fd_);
}

std::shared_ptr<ElfFile> find_debug_file(const ElfFile& file, const ElfLimits& limits,
                                         const std::string& root) {
  const std::string& id = file.build_id();
  if (id.size() < 4) return nullptr;
  const std::string path = root + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return nullptr;
  ElfRefusal why{};
  auto debug = ElfFile::open(fd, limits, why, true);
  if (!debug || debug->build_id() != id) return nullptr;
  return debug;
}

std::shared_ptr<ElfFile> ElfFile::debug_file() const {
  std::call_once(debug_once_, [this] { debug_ = find_debug_file(*this, limits_); });
  return debug_;
}

Dwfl_Module* ElfFile::report(Dwfl* dwfl, const std::string& name, std::uint64_t bias) const {
  Dwfl_Module* mod = dwfl_report_module(dwfl, name.c_str(), low_ + bias, high_ + bias);
  if (!mod) return nullptr;
  void** userdata = nullptr;
  dwfl_module_info(mod, &userdata, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  *userdata = const_cast<ElfFile*>(this);
  return mod;
}

namespace {

int checked_elf(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**, Elf** elfp) {
  const auto* file = static_cast<const ElfFile*>(*userdata);
  *elfp = elf_begin(file->fd(), ELF_C_READ, file->elf());
  return -1;
}

int checked_debug_file(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, const char*,
                       const char*, GElf_Word, char**) {
  const auto* file = static_cast<const ElfFile*>(*userdata);
  errno = 0;
  // libdwfl asks this of a module once for its debug file, then (where that has a
  // .gnu_debugaltlink, as dwz makes) again for the alternate file: not looked for, so
  // that it never takes the debug file itself for one.
  if (file->debug_file_given_.exchange(true)) return -1;
  const auto debug = file->debug_file();
  // libdwfl maps it: a file of the root-owned debug tree, which no user can truncate.
  return debug ? fcntl(debug->fd(), F_DUPFD_CLOEXEC, 0) : -1;
}

int no_debug_file(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*,
                  GElf_Word, char**) {
  errno = 0;
  return -1;
}

// Inlined scopes followed for one address, at most (dwarf_getscopes itself gives them
// all): DWARF from a user's file can claim any nesting.
constexpr int kMaxScopes = 64;

// An inlined function's name: its linkage name demangled, else its name.
std::string die_name(Dwarf_Die* d) {
  Dwarf_Attribute a;
  const char* linkage = dwarf_formstring(dwarf_attr_integrate(d, DW_AT_linkage_name, &a));
  if (!linkage) linkage = dwarf_formstring(dwarf_attr_integrate(d, DW_AT_MIPS_linkage_name, &a));
  if (linkage) return demangle(linkage);
  const char* name = dwarf_diename(d);
  return name ? name : "[inlined]";
}

// The compilation unit whose code holds `addr`: from .debug_aranges where the file has them,
// else by reading each unit's ranges. clang and rustc write no .debug_aranges unless asked
// to, and libdw 0.188 (Debian 12's) finds no unit without them. A hostile file can give
// millions of units, or units that all name one huge range list: at most kMaxRangesRead
// ranges are read for one address, past which `gave_up` is set (the caller reads no more of
// the file's DWARF).
Dwarf_Die* unit_at(Dwfl_Module* mod, std::uint64_t addr, Dwarf_Addr& bias, bool& gave_up) {
  if (Dwarf_Die* cu = dwfl_module_addrdie(mod, addr, &bias)) return cu;
  constexpr int kMaxRangesRead = 100000;
  int read = 0;
  for (Dwarf_Die* cu = nullptr; (cu = dwfl_module_nextcu(mod, cu, &bias)) != nullptr;) {
    Dwarf_Addr base = 0, lo = 0, hi = 0;
    for (ptrdiff_t at = 0; (at = dwarf_ranges(cu, at, &base, &lo, &hi)) > 0;) {
      if (++read > kMaxRangesRead) {
        gave_up = true;
        return nullptr;
      }
      if (addr - bias >= lo && addr - bias < hi) return cu;
    }
    if (++read > kMaxRangesRead) {  // a unit without ranges costs a read too
      gave_up = true;
      return nullptr;
    }
  }
  return nullptr;
}

}  // namespace

// The lines at `addr` (see Frame::lines): the inlined functions whose scopes hold it,
// innermost first, each with the line it is at, then `function` (the symbol's name) with
// the line where the outermost of them was inlined.
std::optional<std::vector<SourceLine>> source_lines(Dwfl_Module* mod, std::uint64_t addr,
                                                    const std::string& function) {
  std::vector<SourceLine> out;
  Dwarf_Addr cu_bias = 0;
  bool gave_up = false;
  Dwarf_Die* cu = unit_at(mod, addr, cu_bias, gave_up);
  if (gave_up) return std::nullopt;
  if (!cu) return out;
  // A line table that cannot be read is read again at every lookup, and libdw 0.188 leaks a
  // little each time: the caller reads no more of this file's DWARF.
  Dwarf_Lines* table = nullptr;
  std::size_t rows = 0;
  if (dwarf_hasattr(cu, DW_AT_stmt_list) && dwarf_getsrclines(cu, &table, &rows) != 0)
    return std::nullopt;
  std::string file;
  int line = 0;
  if (Dwarf_Line* l = dwarf_getsrc_die(cu, addr - cu_bias)) {
    if (const char* f = dwarf_linesrc(l, nullptr, nullptr)) file = f;
    if (dwarf_lineno(l, &line) != 0) line = 0;
  }
  Dwarf_Die* scopes = nullptr;
  const int n = dwarf_getscopes(cu, addr - cu_bias, &scopes);
  for (int i = 0; i < n && i < kMaxScopes; ++i) {
    Dwarf_Die* d = &scopes[i];
    const int tag = dwarf_tag(d);
    if (tag == DW_TAG_subprogram) break;
    if (tag != DW_TAG_inlined_subroutine) continue;
    out.push_back({die_name(d), file, static_cast<std::uint32_t>(std::max(line, 0))});
    // The line it was inlined at, in the function around it.
    Dwarf_Attribute a;
    Dwarf_Word v = 0;
    line = dwarf_formudata(dwarf_attr(d, DW_AT_call_line, &a), &v) == 0
               ? static_cast<int>(std::min<Dwarf_Word>(v, INT32_MAX))
               : 0;
    file.clear();
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    if (dwarf_formudata(dwarf_attr(d, DW_AT_call_file, &a), &v) == 0 &&
        dwarf_getsrcfiles(cu, &files, &nfiles) == 0 && v < nfiles) {
      if (const char* f = dwarf_filesrc(files, v, nullptr, nullptr)) file = f;
    }
  }
  free(scopes);
  if (out.empty() && file.empty()) return out;  // DWARF that knows nothing of it
  out.push_back({function, file, static_cast<std::uint32_t>(std::max(line, 0))});
  return out;
}

const Dwfl_Callbacks& dwfl_callbacks(bool debug_files) {
  static char* no_path = nullptr;
  static const Dwfl_Callbacks with = {checked_elf, checked_debug_file, dwfl_offline_section_address,
                                      &no_path};
  static const Dwfl_Callbacks without = {checked_elf, no_debug_file, dwfl_offline_section_address,
                                         &no_path};
  return debug_files ? with : without;
}

DwflSession::DwflSession(const ElfFile& file, const std::string& name, bool debug_files)
    : dwfl_(dwfl_begin(&dwfl_callbacks(debug_files))) {
  if (!dwfl_) return;
  dwfl_report_begin(dwfl_);
  module_ = file.report(dwfl_, name);
  dwfl_report_end(dwfl_, nullptr, nullptr);
}

DwflSession::~DwflSession() {
  if (dwfl_) dwfl_end(dwfl_);
}

DwflSession::DwflSession(DwflSession&& other) noexcept
    : dwfl_(std::exchange(other.dwfl_, nullptr)), module_(std::exchange(other.module_, nullptr)) {}

DwflSession& DwflSession::operator=(DwflSession&& other) noexcept {
  if (this != &other) {
    if (dwfl_) dwfl_end(dwfl_);
    dwfl_ = std::exchange(other.dwfl_, nullptr);
    module_ = std::exchange(other.module_, nullptr);
  }
  return *this;
}

}  // namespace ebpf_metricsd::profiling
