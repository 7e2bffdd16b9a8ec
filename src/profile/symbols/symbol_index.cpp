#include "ebpf_metricsd/profile/symbol_index.h"

#include <gelf.h>

#include <algorithm>
#include <map>
#include <utility>

namespace ebpf_metricsd::profiling {

namespace {
constexpr std::size_t kMaxSteps = 4096;

int binding_rank(std::uint8_t b) {
  return b == STB_GLOBAL ? 3 : b == STB_WEAK ? 2 : b == STB_LOCAL ? 1 : 0;
}
}  // namespace

SymbolIndex::SymbolIndex(Dwfl_Module* mod) {
  const int n = mod ? dwfl_module_getsymtab(mod) : 0;
  // A label's section, by (file, index): its address range in the module.
  std::map<std::pair<Elf*, GElf_Word>, std::uint32_t> slots;
  for (int i = 1; i < n; ++i) {
    GElf_Sym sym;
    GElf_Addr addr = 0;
    GElf_Word shndx = 0;
    Elf* elf = nullptr;
    Dwarf_Addr bias = 0;
    const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, &elf, &bias);
    if (!name || !*name || sym.st_shndx == SHN_UNDEF) continue;
    const int type = GELF_ST_TYPE(sym.st_info);
    if (type == STT_SECTION || type == STT_FILE || type == STT_TLS) continue;
    const auto bind = static_cast<std::uint8_t>(GELF_ST_BIND(sym.st_info));
    std::uint32_t section = kExact;
    if (sym.st_size == 0 && shndx < SHN_LORESERVE && elf) {
      auto [slot, fresh] = slots.try_emplace({elf, shndx}, kExact);
      if (fresh) {
        GElf_Shdr sh;
        if (Elf_Scn* scn = elf_getscn(elf, shndx); scn && gelf_getshdr(scn, &sh)) {
          slot->second = static_cast<std::uint32_t>(sections_.size());
          sections_.push_back({sh.sh_addr + bias, sh.sh_addr + bias + sh.sh_size});
        }
      }
      section = slot->second;
    }
    (bind == STB_LOCAL ? locals_ : globals_)
        .symbols.push_back({addr, sym.st_size, name, bind, section});
  }
  globals_.sort();
  locals_.sort();
}

void SymbolIndex::Table::sort() {
  std::stable_sort(symbols.begin(), symbols.end(),
                   [](const Symbol& a, const Symbol& b) { return a.addr < b.addr; });
  symbols.shrink_to_fit();
  reach.reserve(symbols.size());
  std::uint64_t highest = 0;
  for (const Symbol& s : symbols) {
    // Saturated: a hostile file's size can reach past the address space.
    const std::uint64_t end = s.size > UINT64_MAX - s.addr ? UINT64_MAX : s.addr + s.size;
    highest = std::max(highest, end);
    reach.push_back(highest);
  }
}

std::size_t SymbolIndex::bytes() const {
  return symbols() * (sizeof(Symbol) + sizeof(std::uint64_t)) + sections_.size() * sizeof(Range);
}

bool SymbolIndex::in_section(const Symbol& label, std::uint64_t addr) const {
  if (label.section == kExact) return label.addr == addr;
  // Its end included: libdwfl names the address just past a section (_edata, _end) by the
  // labels that end it.
  const Range& r = sections_[label.section];
  return addr >= r.start && addr <= r.end;
}

void SymbolIndex::Table::search(const SymbolIndex& index, std::uint64_t addr, const Symbol*& sized,
                                const Symbol*& label, std::uint64_t& min_label) const {
  const std::size_t above = static_cast<std::size_t>(
      std::upper_bound(symbols.begin(), symbols.end(), addr,
                       [](std::uint64_t a, const Symbol& s) { return a < s.addr; }) -
      symbols.begin());
  if (above == 0) return;
  // A label below a symbol that reaches past it names nothing beyond that symbol.
  min_label = std::max(min_label, reach[above - 1]);
  // Labels: only those at the highest address at or below addr can pass min_label; of those,
  // the last in the table (the first met here) that shares addr's section.
  const std::uint64_t top = symbols[above - 1].addr;
  for (std::size_t i = above; i > 0 && symbols[i - 1].addr == top; --i) {
    const Symbol& s = symbols[i - 1];
    if (s.size != 0 || !index.in_section(s, addr)) continue;
    if (!label || label->addr <= s.addr) label = &s;
    break;
  }
  // Sized symbols that hold addr: none at or below i once reach[i] <= addr. Walked from the
  // highest start down, so an equal candidate found later is the earlier in the table; one
  // found, only those at its start can still win. A symbol that spans much of the file (a
  // hostile file's: a real one's functions do not nest) would make the walk long: it stops
  // after kMaxSteps, the address then named by what was found.
  std::size_t steps = 0;
  for (std::size_t i = above; i > 0 && reach[i - 1] > addr && steps < kMaxSteps; --i, ++steps) {
    const Symbol& s = symbols[i - 1];
    if (sized && s.addr < sized->addr) break;
    if (s.size == 0 || addr - s.addr >= s.size) continue;
    if (!sized || sized->addr < s.addr) {
      sized = &s;
      continue;
    }
    if (sized->addr != s.addr) continue;
    const int have = binding_rank(sized->binding), rank = binding_rank(s.binding);
    if (rank > have || (rank == have && s.size <= sized->size)) sized = &s;
  }
}

const char* SymbolIndex::at(std::uint64_t addr, std::uint64_t* start) const {
  const Symbol* sized = nullptr;
  const Symbol* label = nullptr;
  std::uint64_t min_label = 0;
  globals_.search(*this, addr, sized, label, min_label);
  if (!sized && (!label || label->addr != addr))
    locals_.search(*this, addr, sized, label, min_label);
  const Symbol* named = sized ? sized : (label && label->addr >= min_label) ? label : nullptr;
  if (!named) return nullptr;
  if (start) *start = named->addr;
  return named->name;
}

}  // namespace ebpf_metricsd::profiling
