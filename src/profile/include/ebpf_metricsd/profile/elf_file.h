#pragma once

// ELF files from users, read as hostile input. Any local user can write the files their
// processes map (and the debug files those name), so a file is taken only when:
// - it is a regular file (a FIFO or a device would hold or feed the reader), opened
//   non-blocking, no larger than a cap;
// - its headers, its program and section tables and every section's bytes lie inside it, a
//   compressed section does not claim to grow past the cap, and its symbol tables hold at most
//   a bounded number of symbols (libdwfl searches them linearly);
// - it is read with pread, never mapped: its owner can truncate it at any moment, and a page
//   of a mapping past the end of the file is SIGBUS to whoever reads it.
// The checks are of the tables libelf has read into memory, so a file rewritten after them
// changes only bytes libelf copies (and checks against the size) when it reads a section.

#include <elfutils/libdwfl.h>
#include <libelf.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ebpf_metricsd::profiling {

struct ElfLimits {
  std::uint64_t max_file_size = std::uint64_t{1} << 30;   // 1 GiB
  std::uint64_t max_symbols = 4u << 20;                   // per symbol table (24 bytes each)
  std::uint64_t max_inflated = std::uint64_t{256} << 20;  // a compressed section, inflated
};

// Why a file was not taken.
enum class ElfRefusal {
  NotRegular,      // a FIFO, a device, a directory
  TooLarge,        // beyond max_file_size
  NotElf,          // not a 64-bit little-endian x86-64 ELF file
  BadTables,       // a header, a table or a section's bytes outside the file
  TooManySymbols,  // a symbol table past max_symbols
  Unreadable,      // the file could not be read (gone, I/O error)
};
inline constexpr std::array kElfRefusals = {ElfRefusal::NotRegular,     ElfRefusal::TooLarge,
                                            ElfRefusal::NotElf,         ElfRefusal::BadTables,
                                            ElfRefusal::TooManySymbols, ElfRefusal::Unreadable};
std::string_view elf_refusal_name(ElfRefusal why);

// One checked file, read through libelf. Shared by every libdwfl session that uses it
// (symbols, and the unwinder of each process that maps it): each takes a reference of its
// own to the Elf with elf_begin(fd(), ELF_C_READ, elf()) and gives it back with elf_end; the
// descriptor lives as long as this object.
class ElfFile {
 public:
  // Takes `fd`. nullptr, with `why` set, when the file is refused. `debug`: a separate
  // debug file (its program headers describe bytes of another file).
  static std::shared_ptr<ElfFile> open(int fd, const ElfLimits& limits, ElfRefusal& why,
                                       bool debug = false);
  ~ElfFile();
  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;

  Elf* elf() const { return elf_; }
  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }
  // The GNU build ID as hex, "" when the file has none.
  const std::string& build_id() const { return build_id_; }
  // Where libdwfl places the file with load bias 0: the first PT_LOAD's address rounded
  // down to its alignment, as libdwfl rounds it, and the end of the highest segment.
  std::uint64_t low() const { return low_; }
  std::uint64_t high() const { return high_; }
  // The size of its DWARF sections (.debug_*), inflated; 0 when it has none, or none to be
  // read for lines (a string section without its final NUL, or compressed outside the
  // debug tree).
  std::uint64_t dwarf_bytes() const { return dwarf_bytes_; }
  // Whether it holds DWARF of its own (.debug_info or .debug_line), usable or not: libdwfl
  // reads a file's own DWARF before any debug file's.
  bool has_dwarf() const { return has_dwarf_; }
  // The size of the tables symbols and unwinding read: symbol and string tables, CFI.
  std::uint64_t table_bytes() const { return table_bytes_; }

  // Reports the file to `dwfl` (between dwfl_report_begin and dwfl_report_end) as module
  // `name`, its addresses moved by `bias`, for a Dwfl begun with dwfl_callbacks(): libdwfl
  // then reads this checked file and opens none by itself. nullptr when libdwfl refuses it.
  // DwflSession does all of that.
  Dwfl_Module* report(Dwfl* dwfl, const std::string& name, std::uint64_t bias = 0) const;

  // The separate debug file of this file (find_debug_file), looked for once and kept with
  // it; nullptr when there is none.
  std::shared_ptr<ElfFile> debug_file() const;
  // Set when libdwfl has been given the debug file (dwfl_callbacks).
  mutable std::atomic<bool> debug_file_given_{false};

 private:
  ElfFile() = default;
  int fd_ = -1;
  Elf* elf_ = nullptr;
  std::uint64_t size_ = 0, low_ = 0, high_ = 0, dwarf_bytes_ = 0, table_bytes_ = 0;
  std::string build_id_;
  ElfLimits limits_;
  bool has_dwarf_ = false;
  mutable std::once_flag debug_once_;
  mutable std::shared_ptr<ElfFile> debug_;
};

// "_ZN3foo3barEv" -> "foo::bar()"; other names unchanged.
std::string demangle(const std::string& name);

// A source line of a user frame, from the DWARF of its file (or of the file's debug file).
struct SourceLine {
  std::string function;  // demangled
  std::string file;      // the source file as DWARF names it
  std::uint32_t line = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 misreads a defaulted operator<=>.
  auto operator<=>(const SourceLine&) const = default;
};

// The source lines of address `addr` of `mod` (a module of a Dwfl begun with
// dwfl_callbacks(true)): the functions inlined there, innermost first, each with the line it
// is at, then `function` (the symbol's name) with the line where the outermost of them was
// inlined (or of the address). Empty where its DWARF knows nothing of the address; nullopt
// where the line table it would be in cannot be read, or where finding its unit in a file
// without .debug_aranges takes more than 100,000 ranges (then read no more of the module's
// DWARF). At most 64 inlined levels are looked at.
std::optional<std::vector<SourceLine>> source_lines(Dwfl_Module* mod, std::uint64_t addr,
                                                    const std::string& function);

// The callbacks of a Dwfl whose modules are reported by ElfFile::report: a module's file is
// its ElfFile; with `debug_files`, its separate debug file is ElfFile::debug_file() (never a
// .gnu_debuglink target, never the network), without, none is looked for.
const Dwfl_Callbacks& dwfl_callbacks(bool debug_files);

// A libdwfl session over one checked file: begun with dwfl_callbacks(debug_files), the file
// reported at bias 0 (its link-time addresses) as module `name`, ended when the session goes.
// The one way the daemon, its tests and the fuzz target read a file with libdwfl. The file
// must outlive the session.
class DwflSession {
 public:
  DwflSession() = default;
  DwflSession(const ElfFile& file, const std::string& name, bool debug_files);
  ~DwflSession();
  DwflSession(DwflSession&& other) noexcept;
  DwflSession& operator=(DwflSession&& other) noexcept;
  DwflSession(const DwflSession&) = delete;
  DwflSession& operator=(const DwflSession&) = delete;
  // The file's module; nullptr when libdwfl could not take it.
  Dwfl_Module* module() const { return module_; }

 private:
  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* module_ = nullptr;
};

// The separate debug file of a checked file, found by its build ID under `root`
// (<root>/.build-id/ab/cdef....debug), which is where Debian's -dbgsym packages install
// them: a root-owned tree. A .gnu_debuglink name is never followed (it can name any file,
// a FIFO included). Checked as ElfFile::open checks, and taken only when its build ID is
// the file's. nullptr when there is none.
std::shared_ptr<ElfFile> find_debug_file(const ElfFile& file, const ElfLimits& limits,
                                         const std::string& root = "/usr/lib/debug");

}  // namespace ebpf_metricsd::profiling
