// Unwind tables (profile/unwind_table.h): at every address of a file's code, the table gives
// the rule libdw's own CFI interpreter finds there, for the tests' workload with and without
// frame pointers and for Debian's C library; the forms the walk follows are found where they
// are (PLT entries, the signal return, the stack's end); bounds and damaged CFI refuse or cut,
// never crash.
#include <elf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/unwind_table.h"

using namespace ebpf_metricsd::profiling;
namespace fs = std::filesystem;

namespace {

const std::string kLibc = "/lib/x86_64-linux-gnu/libc.so.6";

int open_user_file(const std::string& path) {
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
}

std::shared_ptr<ElfFile> checked(const std::string& path) {
  ElfRefusal why{};
  const int fd = open_user_file(path);
  REQUIRE(fd >= 0);
  auto f = ElfFile::open(fd, ElfLimits{}, why);
  INFO(path << " refused: " << elf_refusal_name(why));
  REQUIRE(f);
  return f;
}

std::string text(const UnwindRule& r) {
  std::ostringstream s;
  s << "kind " << int{r.kind} << " cfa " << r.cfa_offset << " ra " << r.ra_offset << " fp "
    << int{r.fp} << "@" << r.fp_offset << " plt " << int{r.plt_threshold};
  return s.str();
}

// The file's own CFI, read by libdw apart from the table: the oracle.
struct Oracle {
  int fd = -1;
  Elf* elf = nullptr;
  Dwarf_CFI* cfi = nullptr;
  explicit Oracle(const std::string& path) {
    elf_version(EV_CURRENT);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    elf = elf_begin(fd, ELF_C_READ, nullptr);
    REQUIRE(elf);
    cfi = dwarf_getcfi_elf(elf);
    REQUIRE(cfi);
  }
  ~Oracle() {
    if (cfi) dwarf_cfi_end(cfi);
    if (elf) elf_end(elf);
    if (fd >= 0) ::close(fd);
  }
  Oracle(const Oracle&) = delete;
  Oracle& operator=(const Oracle&) = delete;
  // The executable segments' address ranges.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> code() const {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    std::size_t n = 0;
    REQUIRE(elf_getphdrnum(elf, &n) == 0);
    for (std::size_t i = 0; i < n; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD &&
          (ph.p_flags & PF_X))
        out.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_filesz);
    }
    return out;
  }
  std::uint64_t entry() const {
    GElf_Ehdr eh;
    REQUIRE(gelf_getehdr(elf, &eh));
    return eh.e_entry;
  }
};

struct Compared {
  std::size_t addresses = 0, mismatches = 0, covered = 0;
  std::string first;
};

// Every `step`th address of the file's code: the table's rule against libdw's.
Compared compare(const UnwindTable& t, const Oracle& o, std::uint64_t step) {
  Compared c;
  for (const auto& [lo, hi] : o.code()) {
    for (std::uint64_t a = lo; a < hi; a += step) {
      ++c.addresses;
      const UnwindRule want = unwind_rule_at(o.cfi, a);
      const UnwindRule got = t.find(a);
      if (want.kind != EMD_UNWIND_NONE) ++c.covered;
      if (want != got && ++c.mismatches == 1) {
        std::ostringstream s;
        s << "0x" << std::hex << a << std::dec << ": table " << text(got) << ", libdw "
          << text(want);
        c.first = s.str();
      }
    }
  }
  return c;
}

std::size_t rows_of_kind(const UnwindTable& t, std::uint8_t kind) {
  std::size_t n = 0;
  for (const auto& r : t.rows) n += t.rules[r.rule].kind == kind;
  return n;
}

}  // namespace

// In the sanitizer tree (tests/sanitizers.sh) the workloads carry the sanitizers' runtime,
// thousands of functions built without frame pointers: there the workload built with them
// does not keep them as a whole file.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMD_WORKLOADS_SANITIZED 1
#endif
#endif
#ifndef EMD_WORKLOADS_SANITIZED
#define EMD_WORKLOADS_SANITIZED 0
#endif

TEST_CASE("unwind tables: every address's rule is the one libdw's interpreter finds",
          "[unwind_table]") {
  struct Case {
    std::string path;
    std::uint64_t step;
    bool frame_pointers;
  };
  const Case c =
      GENERATE(Case{PROFILE_WORKLOAD_NOFP, 1, false},
               Case{PROFILE_WORKLOAD_FP, 1, !EMD_WORKLOADS_SANITIZED}, Case{kLibc, 3, false});
  INFO(c.path);
  const auto file = checked(c.path);
  UnwindTableRefusal why{};
  const auto t = build_unwind_table(*file, UnwindTableLimits{}, why);
  INFO("refused: " << unwind_table_refusal_name(why));
  REQUIRE(t);
  CHECK(t->bad_fdes == 0);
  CHECK(t->fdes > 0);
  CHECK(t->frame_pointers == c.frame_pointers);
  const Oracle o(c.path);
  const Compared cmp = compare(*t, o, c.step);
  INFO(cmp.addresses << " addresses, " << cmp.covered
                     << " with CFI; first mismatch: " << cmp.first);
  CHECK(cmp.mismatches == 0);
  CHECK(cmp.covered * 10 >= cmp.addresses * 8);  // the code is nearly all described
  // Rows are sorted and distinct within each page, and every page has some.
  for (const auto& p : t->pages) {
    REQUIRE(p.count > 0);
    for (std::uint32_t i = p.first + 1; i < p.first + p.count; ++i)
      REQUIRE(t->rows[i - 1].lo < t->rows[i].lo);
  }
  // The forms the walk follows, where each is: PLT entries (calls into other files), the
  // program's entry (the stack's end: _start leaves the return address undefined).
  CHECK(rows_of_kind(*t, EMD_UNWIND_PLT) > 0);
  if (c.path != kLibc) CHECK(t->find(o.entry()).kind == EMD_UNWIND_END);
}

TEST_CASE("unwind tables: the C library's signal return and thread start", "[unwind_table]") {
  const auto file = checked(kLibc);
  UnwindTableRefusal why{};
  const auto t = build_unwind_table(*file, UnwindTableLimits{}, why);
  REQUIRE(t);
  // __restore_rt: the interrupted rsp, rip and rbp in the ucontext the kernel pushed
  // (uc_mcontext at 40; rsp, rip and rbp at 120, 128 and 80 into it).
  bool signal = false;
  for (const auto& r : t->rules) {
    if (r.kind != EMD_UNWIND_SIGNAL) continue;
    signal = true;
    CHECK(r.cfa_offset == 160);
    CHECK(r.ra_offset == 168);
    CHECK(r.fp_offset == 120);
  }
  CHECK(signal);
  // clone3's child and _start of a program begin with an undefined return address.
  CHECK(rows_of_kind(*t, EMD_UNWIND_END) > 0);
  // Ordinary frames: the return address just below the CFA.
  std::size_t rsp = 0;
  for (const auto& r : t->rules) {
    if (r.kind == EMD_UNWIND_CFA_RSP) {
      ++rsp;
      CHECK(r.ra_offset == -8);
    }
  }
  CHECK(rsp > 0);
  // What the kernel holds for it: about 4 bytes a row.
  CHECK(t->kernel_bytes() < 512 * 1024);
}

TEST_CASE("unwind tables: bounds and damaged CFI refuse or cut, never crash", "[unwind_table]") {
  const std::string dir = "/tmp/emd-unwind-table-unit-" + std::to_string(getpid());
  fs::create_directories(dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};
  SECTION("limits of FDEs and rows") {
    const auto file = checked(PROFILE_WORKLOAD_NOFP);
    UnwindTableRefusal why{};
    UnwindTableLimits few;
    few.max_fdes = 2;
    CHECK_FALSE(build_unwind_table(*file, few, why));
    CHECK(why == UnwindTableRefusal::TooLarge);
    UnwindTableLimits rows;
    rows.max_rows = 10;
    CHECK_FALSE(build_unwind_table(*file, rows, why));
    CHECK(why == UnwindTableRefusal::TooLarge);
  }
  SECTION("a file without CFI") {
    const std::string bare = dir + "/bare";
    REQUIRE(std::system(("objcopy --remove-section .eh_frame --remove-section .eh_frame_hdr "
                         "--remove-section .debug_frame " +
                         std::string(PROFILE_WORKLOAD_NOFP) + " " + bare)
                            .c_str()) == 0);
    UnwindTableRefusal why{};
    CHECK_FALSE(build_unwind_table(*checked(bare), UnwindTableLimits{}, why));
    CHECK(why == UnwindTableRefusal::NoCfi);
  }
  SECTION(".eh_frame overwritten at random places") {
    // Where .eh_frame lies in the file.
    std::uint64_t offset = 0, size = 0;
    {
      const Oracle o(PROFILE_WORKLOAD_NOFP);
      std::size_t strndx = 0;
      REQUIRE(elf_getshdrstrndx(o.elf, &strndx) == 0);
      for (Elf_Scn* scn = elf_nextscn(o.elf, nullptr); scn; scn = elf_nextscn(o.elf, scn)) {
        GElf_Shdr sh;
        REQUIRE(gelf_getshdr(scn, &sh));
        const char* name = elf_strptr(o.elf, strndx, sh.sh_name);
        if (name && std::string(name) == ".eh_frame") {
          offset = sh.sh_offset;
          size = sh.sh_size;
        }
      }
    }
    REQUIRE(size > 64);
    std::ifstream in(PROFILE_WORKLOAD_NOFP, std::ios::binary);
    const std::string original((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    std::mt19937_64 rng(45);
    std::size_t tables = 0, refused = 0;
    for (int round = 0; round < 200; ++round) {
      std::string bytes = original;
      const int writes = 1 + static_cast<int>(rng() % 16);
      for (int i = 0; i < writes; ++i)
        bytes[offset + rng() % size] = static_cast<char>(rng() & 0xff);
      const std::string path = dir + "/damaged";
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
      UnwindTableRefusal why{};
      const auto t = build_unwind_table(*checked(path), UnwindTableLimits{}, why);
      if (t) {
        ++tables;
        // Whatever was read stays inside what the kernel side can hold.
        for (const auto& p : t->pages) REQUIRE(p.count <= (1u << EMD_UNWIND_PAGE_BITS));
        for (const auto& r : t->rows) REQUIRE(r.rule < t->rules.size());
      } else {
        ++refused;
      }
    }
    INFO(tables << " tables, " << refused << " refused");
    CHECK(tables + refused == 200);
    CHECK(tables > 0);  // a damaged FDE costs that FDE, not the file
  }
}
