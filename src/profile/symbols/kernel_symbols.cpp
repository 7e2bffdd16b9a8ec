// Kernel frames: /proc/kallsyms (modules and BPF programs included).
#include <bpf/bpf.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ebpf_metricsd/profile/symbols.h"
#include "text.h"

namespace ebpf_metricsd::profiling {

using text::hex;
using text::read_file;

KernelSymbols::KernelSymbols(std::string kallsyms, std::string modules)
    : kallsyms_(std::move(kallsyms)), modules_(std::move(modules)) {}

std::string KernelSymbols::signature() const {
  // Modules as the kernel lists them, and the ids of the BPF programs loaded: either
  // changes the text symbols (a BPF program's symbol is bpf_prog_<tag>_<name> [bpf]).
  std::string sig = read_file(modules_);
  std::uint32_t id = 0;
  while (bpf_prog_get_next_id(id, &id) == 0) sig += ":" + std::to_string(id);
  return sig;
}

void KernelSymbols::refresh() {
  std::string sig = signature();
  if (loaded_ && sig == signature_) return;
  signature_ = std::move(sig);
  load();
  loaded_ = true;
}

void KernelSymbols::load() {
  struct Sym {
    std::uint64_t start;
    std::uint32_t name;
  };
  std::vector<Sym> syms;
  std::string arena;
  // Sized as the table read last, which goes first: two tables at once (and vectors grown
  // by doubling) would add their size to the daemon's peak memory at every reread.
  syms.reserve(starts_.size() + 4096);
  arena.reserve(arena_.size() + 256 * 1024);
  std::vector<std::uint64_t>().swap(starts_);
  std::vector<std::uint32_t>().swap(names_);
  std::string().swap(arena_);
  std::ifstream in(kallsyms_);
  std::string line;
  while (std::getline(in, line)) {
    // "ffffffff81000000 T _stext" or "ffffffffc0a01000 t ext4_foo\t[ext4]"
    char* end = nullptr;
    const std::uint64_t addr = std::strtoull(line.c_str(), &end, 16);
    if (end == line.c_str() || addr == 0 || *end != ' ') continue;
    const char type = end[1];
    if (type != 't' && type != 'T' && type != 'w' && type != 'W') continue;
    std::string_view rest(end + 2);
    if (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    std::string_view name = rest, module = "kernel";
    if (const auto tab = rest.find('\t'); tab != std::string_view::npos) {
      name = rest.substr(0, tab);
      module = rest.substr(tab + 1);
      if (module.size() >= 2 && module.front() == '[' && module.back() == ']') {
        module = module.substr(1, module.size() - 2);
      }
    }
    syms.push_back({addr, static_cast<std::uint32_t>(arena.size())});
    arena.append(name);
    arena.push_back('\0');
    arena.append(module);
    arena.push_back('\0');
  }
  std::stable_sort(syms.begin(), syms.end(),
                   [](const Sym& a, const Sym& b) { return a.start < b.start; });
  starts_.reserve(syms.size());
  names_.reserve(syms.size());
  for (const Sym& s : syms) {
    starts_.push_back(s.start);
    names_.push_back(s.name);
  }
  arena_ = std::move(arena);
  arena_.shrink_to_fit();
}

Frame KernelSymbols::resolve(std::uint64_t address, bool return_address) const {
  Frame f;
  f.kernel = true;
  f.address = address;
  f.module = "[kernel]";
  const std::uint64_t at = return_address && address > 0 ? address - 1 : address;
  auto it = std::upper_bound(starts_.begin(), starts_.end(), at);
  if (it == starts_.begin()) {
    f.function = "[kernel]+" + hex(address);
    return f;
  }
  const std::size_t i = static_cast<std::size_t>(it - starts_.begin()) - 1;
  const char* name = arena_.data() + names_[i];
  const char* module = name + std::strlen(name) + 1;
  f.function = name;
  if (std::strcmp(module, "kernel") != 0) f.module = std::string("[") + module + "]";
  return f;
}

}  // namespace ebpf_metricsd::profiling
