#pragma once
// What the daemon does with a user's ELF file, on one buffer: checked as ElfFile (elf_file.h)
// and, when taken, read through libdwfl as the symbolizer and the unwinder read it (symbols by
// address across its load range through the symbol index, their source lines from its DWARF,
// CFI for the same addresses, the build ID) and compiled into an unwind table as the walk in
// the kernel reads it. Shared by the libFuzzer target (elf_fuzz.cpp) and the unit suite, which
// replays the seed corpus.
#include <elf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/symbol_index.h"
#include "ebpf_metricsd/profile/unwind_table.h"

namespace ebpf_metricsd::test {

// The number of addresses named (for the caller to use, so nothing is optimized out).
inline std::size_t exercise_elf(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd_create("elf", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  profiling::ElfLimits limits;
  limits.max_file_size = 16u << 20;
  profiling::ElfRefusal why{};
  auto file = profiling::ElfFile::open(fd, limits, why);
  if (!file) return 0;
  const profiling::DwflSession session(*file, "fuzz", false);
  std::size_t named = 0;
  if (Dwfl_Module* mod = session.module()) {
    Dwarf_Addr bias = 0;
    if (dwfl_module_getelf(mod, &bias)) {
      const unsigned char* bits = nullptr;
      GElf_Addr vaddr = 0;
      dwfl_module_build_id(mod, &bits, &vaddr);
      Dwarf_CFI* cfi = dwfl_module_eh_cfi(mod, &bias);
      const std::uint64_t span = file->high() - file->low();
      const std::uint64_t step = span / 64 + 1;
      bool lines = file->dwarf_bytes() > 0;
      const profiling::SymbolIndex symbols(mod);
      for (std::uint64_t a = file->low(); a < file->high(); a += step) {
        if (const char* name = symbols.at(a)) {
          ++named;
          // Lines only from DWARF the symbolizer reads (ElfFile::dwarf_bytes), and only until
          // a line table cannot be read, as the symbolizer does.
          if (lines) {
            const auto found = profiling::source_lines(mod, a, name);
            lines = found.has_value();
            if (found) named += found->size();
          }
        }
        Dwarf_Frame* frame = nullptr;
        if (cfi && dwarf_cfi_addrframe(cfi, a - bias, &frame) == 0) {
          Dwarf_Op* ops = nullptr;
          std::size_t nops = 0;
          dwarf_frame_cfa(frame, &ops, &nops);
          free(frame);
        }
      }
    }
  }
  // Bounded as the daemon bounds it, smaller: an input is a few milliseconds.
  profiling::UnwindTableLimits table_limits;
  table_limits.max_rows = 1u << 16;
  table_limits.max_time = std::chrono::milliseconds(2000);
  profiling::UnwindTableRefusal refused{};
  if (auto table = profiling::build_unwind_table(*file, table_limits, refused)) {
    for (std::uint64_t a = file->low(); a < file->high();
         a += (file->high() - file->low()) / 64 + 1)
      named += table->find(a).kind;
  }
  return named;
}

// The seed corpus: real files (`real`, read whole) and broken variants of the first: cut
// short, tables moved past the end, a section claiming a terabyte, a compressed section
// claiming to inflate to one, symbol counts and string offsets made huge.
inline std::vector<std::pair<std::string, std::string>> elf_seed_corpus(
    const std::vector<std::string>& real) {
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t i = 0; i < real.size(); ++i) {
    std::ifstream in(real[i], std::ios::binary);
    out.emplace_back("real-" + std::to_string(i),
                     std::string(std::istreambuf_iterator<char>(in), {}));
  }
  if (out.empty() || out[0].second.size() < sizeof(Elf64_Ehdr)) return out;
  const std::string good = out[0].second;
  Elf64_Ehdr eh;
  std::memcpy(&eh, good.data(), sizeof eh);
  const auto patched = [&](const std::string& name, std::size_t at, const void* v, std::size_t n) {
    std::string b = good;
    if (at + n <= b.size()) std::memcpy(b.data() + at, v, n);
    out.emplace_back(name, std::move(b));
  };
  for (std::size_t d : {2u, 4u, 16u})
    out.emplace_back("cut-" + std::to_string(d), good.substr(0, good.size() / d));
  out.emplace_back("header-only", good.substr(0, sizeof eh));
  const std::uint64_t far = std::uint64_t{1} << 40;
  patched("shoff-far", offsetof(Elf64_Ehdr, e_shoff), &far, 8);
  patched("phoff-far", offsetof(Elf64_Ehdr, e_phoff), &far, 8);
  const std::uint16_t many = 0xfff0;
  patched("shnum-many", offsetof(Elf64_Ehdr, e_shnum), &many, 2);
  patched("phnum-many", offsetof(Elf64_Ehdr, e_phnum), &many, 2);
  patched("shstrndx-far", offsetof(Elf64_Ehdr, e_shstrndx), &many, 2);
  for (std::size_t i = 1; i < eh.e_shnum; ++i) {
    const std::size_t at = eh.e_shoff + i * sizeof(Elf64_Shdr);
    if (at + sizeof(Elf64_Shdr) > good.size()) break;
    Elf64_Shdr sh;
    std::memcpy(&sh, good.data() + at, sizeof sh);
    const std::string n = std::to_string(i);
    patched("section-" + n + "-size-far", at + offsetof(Elf64_Shdr, sh_size), &far, 8);
    patched("section-" + n + "-offset-far", at + offsetof(Elf64_Shdr, sh_offset), &far, 8);
    const std::uint32_t link = 0xffff;
    patched("section-" + n + "-link-far", at + offsetof(Elf64_Shdr, sh_link), &link, 4);
    if (sh.sh_type != SHT_NOBITS && sh.sh_size >= sizeof(Elf64_Chdr)) {
      std::string b = good;
      const std::uint64_t flags = sh.sh_flags | SHF_COMPRESSED;
      std::memcpy(b.data() + at + offsetof(Elf64_Shdr, sh_flags), &flags, 8);
      const Elf64_Chdr ch{ELFCOMPRESS_ZLIB, 0, far, 1};
      if (sh.sh_offset + sizeof ch <= b.size())
        std::memcpy(b.data() + sh.sh_offset, &ch, sizeof ch);
      out.emplace_back("section-" + n + "-inflates-far", std::move(b));
      // Its bytes garbage: tables, strings, CFI and notes read as found.
      b = good;
      for (std::size_t k = 0; k < sh.sh_size && sh.sh_offset + k < b.size(); ++k)
        b[sh.sh_offset + k] = static_cast<char>(0xff ^ (k * 131));
      out.emplace_back("section-" + n + "-garbage", std::move(b));
    }
  }
  return out;
}

}  // namespace ebpf_metricsd::test
