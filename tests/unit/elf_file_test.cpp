// Files from users as hostile input: what ElfFile refuses and why, the debug-file finder,
// and a file truncated by its owner while the symbolizer reads it (no mapping: no SIGBUS).
#include <elf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "../fuzz/elf_exercise.h"
#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/symbol_index.h"
#include "ebpf_metricsd/profile/symbols.h"
#include "ebpf_metricsd/profile/unwind_table.h"

using namespace ebpf_metricsd::profiling;
namespace fs = std::filesystem;

namespace Catch {
template <>
struct StringMaker<ElfRefusal> {
  static std::string convert(ElfRefusal why) { return std::string(elf_refusal_name(why)); }
};
}  // namespace Catch

namespace {

// A small ELF file with symbols, a build ID and sections of every kind (the tests' workload).
const std::string kElf = PROFILE_WORKLOAD_FP;

struct Dir {
  std::string path = "/tmp/emd-elf-unit-" + std::to_string(getpid());
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
  std::string copy(const std::string& name, const std::string& from = kElf) const {
    const std::string to = path + "/" + name;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    return to;
  }
};

int open_user_file(const std::string& path) {
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
}

// Opens `path` as the symbolizer does; the refusal, or nullopt when taken.
std::optional<ElfRefusal> refusal(const std::string& path, const ElfLimits& limits = {}) {
  ElfRefusal why{};
  const int fd = open_user_file(path);
  REQUIRE(fd >= 0);
  return ElfFile::open(fd, limits, why) ? std::nullopt : std::optional(why);
}

Elf64_Ehdr header(const std::string& path) {
  Elf64_Ehdr eh{};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh));
  close(fd);
  return eh;
}

template <typename T>
void write_at(const std::string& path, std::uint64_t offset, const T& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(pwrite(fd, &value, sizeof value, static_cast<off_t>(offset)) ==
          static_cast<ssize_t>(sizeof value));
  close(fd);
}

// The index and header of the first section that `pick` accepts.
template <typename Pick>
std::pair<std::size_t, Elf64_Shdr> section(const std::string& path, Pick pick) {
  const Elf64_Ehdr eh = header(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  for (std::size_t i = 1; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh{};
    REQUIRE(pread(fd, &sh, sizeof sh, static_cast<off_t>(eh.e_shoff + i * sizeof sh)) ==
            static_cast<ssize_t>(sizeof sh));
    if (pick(sh)) {
      close(fd);
      return {i, sh};
    }
  }
  close(fd);
  FAIL("no such section in " << path);
  return {};
}

// The file offset of function `name` in the ELF file at `path`.
std::uint64_t file_offset_of(const std::string& path, const std::string& name) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  REQUIRE(elf);
  std::uint64_t value = 0;
  Elf_Scn* scn = nullptr;
  while (value == 0 && (scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_SYMTAB) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    for (std::size_t i = 0; data && i < sh.sh_size / sizeof(Elf64_Sym); ++i) {
      GElf_Sym sym;
      if (gelf_getsym(data, static_cast<int>(i), &sym) &&
          name == elf_strptr(elf, sh.sh_link, sym.st_name)) {
        value = sym.st_value;
      }
    }
  }
  std::uint64_t offset = 0;
  std::size_t n = 0;
  elf_getphdrnum(elf, &n);
  for (std::size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD &&
        value >= ph.p_vaddr && value < ph.p_vaddr + ph.p_filesz) {
      offset = value - ph.p_vaddr + ph.p_offset;
    }
  }
  elf_end(elf);
  close(fd);
  REQUIRE(value != 0);
  REQUIRE(offset != 0);
  return offset;
}

// A child process that maps `path` whole (read, execute) and waits; where it mapped it.
struct Mapper {
  pid_t pid = -1;
  std::uint64_t start = 0;
  explicit Mapper(const std::string& path) {
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a test that dies
      const int fd = ::open(path.c_str(), O_RDONLY);
      struct stat st {};
      fstat(fd, &st);
      void* at = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_EXEC,
                      MAP_PRIVATE, fd, 0);
      const auto a = reinterpret_cast<std::uint64_t>(at);
      (void)!write(pipefd[1], &a, sizeof a);
      pause();
      _exit(0);
    }
    close(pipefd[1]);
    REQUIRE(read(pipefd[0], &start, sizeof start) == static_cast<ssize_t>(sizeof start));
    close(pipefd[0]);
    REQUIRE(start != 0);
    REQUIRE(start != reinterpret_cast<std::uint64_t>(MAP_FAILED));
  }
  ~Mapper() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST_CASE("elf files: a user's file is read only when it is what it says", "[elf]") {
  Dir dir;
  const ElfLimits limits;

  SECTION("a real executable is taken, with its build ID and load range") {
    ElfRefusal why{};
    auto f = ElfFile::open(open_user_file(dir.copy("good")), limits, why);
    REQUIRE(f);
    CHECK(f->build_id().size() >= 16);
    CHECK(f->low() < f->high());
    CHECK(f->size() == fs::file_size(kElf));
  }
  SECTION("special files are never read: a FIFO, a device, a directory") {
    const std::string fifo = dir.path + "/fifo";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    // Opened non-blocking with no writer: a blocking read would hold the symbolizer.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(refusal(fifo) == ElfRefusal::NotRegular);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK(refusal("/dev/zero") == ElfRefusal::NotRegular);
    CHECK(refusal(dir.path) == ElfRefusal::NotRegular);
  }
  SECTION("a file past the size cap, sparse, is not read at all") {
    const std::string sparse = dir.path + "/sparse";
    const int fd = ::open(sparse.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    REQUIRE(ftruncate(fd, off_t{2} << 30) == 0);
    close(fd);
    CHECK(refusal(sparse) == ElfRefusal::TooLarge);
    ElfLimits small;
    small.max_file_size = 4096;
    CHECK(refusal(dir.copy("small"), small) == ElfRefusal::TooLarge);
  }
  SECTION("not an x86-64 ELF file") {
    const std::string text = dir.path + "/text";
    std::ofstream(text) << "#!/bin/sh\necho not an ELF file\n";
    CHECK(refusal(text) == ElfRefusal::NotElf);
    const std::string other = dir.copy("other");
    write_at(other, offsetof(Elf64_Ehdr, e_machine), std::uint16_t{EM_AARCH64});
    CHECK(refusal(other) == ElfRefusal::NotElf);
  }
  SECTION("a truncated file: its section table is past the end") {
    const std::string cut = dir.copy("cut");
    fs::resize_file(cut, fs::file_size(cut) / 2);
    CHECK(refusal(cut) == ElfRefusal::BadTables);
  }
  SECTION("tables and sections that claim bytes beyond the file") {
    const std::string shoff = dir.copy("shoff");
    write_at(shoff, offsetof(Elf64_Ehdr, e_shoff), std::uint64_t{1} << 40);
    CHECK(refusal(shoff) == ElfRefusal::BadTables);

    const std::string phoff = dir.copy("phoff");
    write_at(phoff, offsetof(Elf64_Ehdr, e_phoff), fs::file_size(phoff) - 8);
    CHECK(refusal(phoff) == ElfRefusal::BadTables);

    const std::string big = dir.copy("big");
    const auto [i, sh] =
        section(big, [](const Elf64_Shdr& s) { return s.sh_type == SHT_PROGBITS; });
    const std::uint64_t at = header(big).e_shoff + i * sizeof(Elf64_Shdr);
    write_at(big, at + offsetof(Elf64_Shdr, sh_size), std::uint64_t{1} << 40);
    CHECK(refusal(big) == ElfRefusal::BadTables);

    // A compressed section that says it inflates to a terabyte.
    const std::string bomb = dir.copy("bomb");
    const auto [j, comment] = section(bomb, [](const Elf64_Shdr& s) {
      return s.sh_type == SHT_PROGBITS && !(s.sh_flags & SHF_ALLOC) && s.sh_size >= 24;
    });
    const std::uint64_t cat = header(bomb).e_shoff + j * sizeof(Elf64_Shdr);
    write_at(bomb, cat + offsetof(Elf64_Shdr, sh_flags), comment.sh_flags | SHF_COMPRESSED);
    Elf64_Chdr ch{ELFCOMPRESS_ZLIB, 0, std::uint64_t{1} << 40, 1};
    write_at(bomb, comment.sh_offset, ch);
    CHECK(refusal(bomb) == ElfRefusal::BadTables);
  }
  SECTION("symbol tables beyond the bound") {
    ElfLimits few;
    few.max_symbols = 8;
    CHECK(refusal(dir.copy("symbols"), few) == ElfRefusal::TooManySymbols);
  }
}

TEST_CASE("elf files: source lines in a file built by clang, whose DWARF has no .debug_aranges",
          "[elf]") {
  ElfRefusal why{};
  auto file = ElfFile::open(open_user_file(LINES_WORKLOAD_CLANG), ElfLimits{}, why);
  REQUIRE(file);
  // The premise: the file has DWARF but no .debug_aranges, the table libdw's address
  // lookups read.
  std::size_t names = 0;
  REQUIRE(elf_getshdrstrndx(file->elf(), &names) == 0);
  bool aranges = false, info = false;
  for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(file->elf(), scn)) != nullptr;) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    const char* name = elf_strptr(file->elf(), names, sh.sh_name);
    aranges |= name && std::string(name) == ".debug_aranges";
    info |= name && std::string(name) == ".debug_info";
  }
  REQUIRE(info);
  REQUIRE_FALSE(aranges);
  // The line of the function's body in its source.
  int line = 0;
  {
    std::ifstream src(LINES_WORKLOAD_SOURCE);
    std::string text;
    for (int n = 1; std::getline(src, text); ++n) {
      if (text.find("/* emd_lined_by_clang's line */") != std::string::npos) line = n;
    }
  }
  REQUIRE(line > 0);

  const DwflSession session(*file, "lines_workload_clang", true);
  Dwfl_Module* mod = session.module();
  REQUIRE(mod);
  GElf_Addr addr = 0;
  for (int i = 0, n = dwfl_module_getsymtab(mod); i < n; ++i) {
    GElf_Sym sym;
    GElf_Addr at = 0;
    const char* name = dwfl_module_getsym_info(mod, i, &sym, &at, nullptr, nullptr, nullptr);
    if (name && std::string(name) == "emd_lined_by_clang") addr = at;
  }
  REQUIRE(addr != 0);
  const auto lines = source_lines(mod, addr, "emd_lined_by_clang");
  REQUIRE(lines);
  REQUIRE(lines->size() == 1);
  CHECK(lines->back().function == "emd_lined_by_clang");
  CHECK_THAT(lines->back().file, Catch::Matchers::EndsWith("lines_workload.c"));
  // Its first instruction: the line of its body, or of its declaration just above.
  CHECK(lines->back().line >= static_cast<std::uint32_t>(line - 1));
  CHECK(lines->back().line <= static_cast<std::uint32_t>(line));
}

TEST_CASE("elf files: debug files only by build ID, checked like the file", "[elf]") {
  Dir dir;
  ElfRefusal why{};
  auto file = ElfFile::open(open_user_file(dir.copy("app")), ElfLimits{}, why);
  REQUIRE(file);
  const std::string id = file->build_id();
  const std::string root = dir.path + "/debug";
  const std::string at = root + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
  fs::create_directories(fs::path(at).parent_path());

  CHECK_FALSE(find_debug_file(*file, ElfLimits{}, root));  // none there
  REQUIRE(mkfifo(at.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(find_debug_file(*file, ElfLimits{}, root));  // a FIFO: not read, not waited for
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  fs::remove(at);
  // Another file's debug data under this one's ID: the IDs differ, it is not taken.
  fs::copy_file(PROFILE_WORKLOAD_NOFP, at);
  CHECK_FALSE(find_debug_file(*file, ElfLimits{}, root));
  fs::remove(at);
  fs::copy_file(kElf, at);
  auto debug = find_debug_file(*file, ElfLimits{}, root);
  REQUIRE(debug);
  CHECK(debug->build_id() == id);
}

TEST_CASE("elf files: a file its owner truncates while it is read", "[elf]") {
  Dir dir;
  const std::uint64_t main_at = file_offset_of(kElf, "main");
  // Named while whole: the test's premise (the mapping, the offset, the name) holds.
  const std::string whole = dir.copy("whole");
  Mapper a(whole);
  UserSymbols u;
  u.capture(a.pid);
  CHECK(u.resolve(a.pid, a.start + main_at, false).function == "main");

  // Opened and checked whole, then cut to one page before its symbols are first read: the
  // reads come short (libelf reads with pread), the frame has no name, nothing faults.
  const std::string cut = dir.copy("cut");
  Mapper b(cut);
  u.capture(b.pid);
  fs::resize_file(cut, 4096);
  const Frame f = u.resolve(b.pid, b.start + main_at, false);
  CHECK(f.function != "main");
  CHECK(f.module == cut);
  // Its unwind table, built from a file checked whole and cut before its CFI is read: the
  // table is refused or cut short, nothing faults.
  const std::string cfi = dir.copy("cfi");
  ElfRefusal refused{};
  auto file = ElfFile::open(open_user_file(cfi), ElfLimits{}, refused);
  REQUIRE(file);
  fs::resize_file(cfi, 4096);
  UnwindTableRefusal why{};
  const auto table = build_unwind_table(*file, UnwindTableLimits{}, why);
  if (table) CHECK(table->find(main_at).kind == EMD_UNWIND_NONE);
}

TEST_CASE("elf files: the fuzzer's seed corpus, each through the whole read", "[elf][corpus]") {
  // Real files and broken variants of one (tests/fuzz/elf_exercise.h): each is checked and,
  // when taken, named and unwound-over by libdwfl as the daemon does. The real ones are taken
  // and their functions named; no input crashes (tests/sanitizers.sh runs this under ASan).
  const auto corpus = ebpf_metricsd::test::elf_seed_corpus({kElf, PROFILE_WORKLOAD_NOFP});
  REQUIRE(corpus.size() > 20);
  // tests/fuzz.sh writes the seeds for libFuzzer from here.
  if (const char* dir = std::getenv("EMD_WRITE_ELF_CORPUS")) {
    fs::create_directories(dir);
    for (const auto& [name, bytes] : corpus)
      std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
  }
  for (const auto& [name, bytes] : corpus) {
    INFO("seed " << name);
    const std::size_t named = ebpf_metricsd::test::exercise_elf(
        reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    if (name.rfind("real-", 0) == 0) CHECK(named > 0);
  }
}

TEST_CASE("elf files: the symbol index names each address as libdwfl's own lookup does", "[elf]") {
  // Files of every kind a host runs: this test (a .symtab with locals and C++ names), the C
  // and C++ libraries (.dynsym alone), the workloads without frame pointers, and where
  // installed an interpreter and a compiler (tens of thousands of exported symbols).
  std::vector<std::string> paths = {"/proc/self/exe", PROFILE_WORKLOAD_NOFP};
  for (const char* p : {"/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6",
                        "/usr/bin/python3.11", "/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus"}) {
    if (fs::exists(p)) paths.emplace_back(p);
  }
  std::size_t files = 0;
  for (const std::string& path : paths) {
    INFO(path);
    ElfRefusal why{};
    ElfLimits limits;
    limits.max_file_size = std::uint64_t{1} << 30;
    limits.max_symbols = 1u << 22;
    auto file = ElfFile::open(open_user_file(path), limits, why);
    REQUIRE(file);
    const DwflSession session(*file, fs::path(path).filename(), true);  // as the daemon opens it
    Dwfl_Module* mod = session.module();
    REQUIRE(mod);
    const SymbolIndex index(mod);
    REQUIRE(index.symbols() > 20);
    // Each symbol's edges and middle, and the addresses between, at most 2,000 of them.
    std::vector<std::uint64_t> addresses;
    for (int i = 1, n = dwfl_module_getsymtab(mod); i < n; ++i) {
      GElf_Sym sym;
      GElf_Addr at = 0;
      if (!dwfl_module_getsym_info(mod, i, &sym, &at, nullptr, nullptr, nullptr)) continue;
      for (const std::uint64_t a : {at - 1, at, at + sym.st_size / 2, at + sym.st_size - 1,
                                    at + sym.st_size, at + sym.st_size + 7})
        addresses.push_back(a);
    }
    std::sort(addresses.begin(), addresses.end());
    addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
    const std::size_t stride = addresses.size() / 2000 + 1;
    std::size_t compared = 0, named = 0;
    for (std::size_t i = 0; i < addresses.size(); i += stride) {
      const std::uint64_t a = addresses[i];
      GElf_Off off = 0;
      GElf_Sym sym;
      const char* dwfl = dwfl_module_addrinfo(mod, a, &off, &sym, nullptr, nullptr, nullptr);
      std::uint64_t start = 0;
      const char* ours = index.at(a, &start);
      INFO("address 0x" << std::hex << a);
      CHECK(std::string(ours ? ours : "(none)") == std::string(dwfl ? dwfl : "(none)"));
      // The same symbol, not another of its name (local functions of two sources).
      if (dwfl && ours) CHECK(start == a - off);
      ++compared;
      named += dwfl != nullptr;
    }
    CHECK(compared > 100);
    CHECK(named * 2 > compared);
    ++files;
  }
  CHECK(files >= 4);
}
