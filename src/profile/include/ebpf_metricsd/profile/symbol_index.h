#pragma once
// The function symbols of one libdwfl module, sorted once and searched by address.
//
// libdwfl's dwfl_module_addrinfo reads every symbol of a file for each address it names: tens
// of thousands for a compiler or a browser, milliseconds a frame. This index makes its choice
// for the files compilers and linkers write (the unit suite compares the two around every
// symbol of real files) with a binary search:
// - symbols that are sections, files or thread-local storage, undefined or nameless never
//   name an address;
// - global and weak symbols first; local ones only when none of those holds the address and
//   no sizeless global one sits exactly at it;
// - among the symbols whose range holds the address, the one starting nearest below it, then
//   the stronger binding (global, weak, local), then the smaller, then the first in the table
//   (where a file nests symbols of different bindings, libdwfl's answer depends on their order
//   in the table; a hostile file's nesting is searched 4,096 symbols deep at most);
// - failing that, a sizeless label (hand-written assembly) in the address's own section at
//   the highest address at or below it (of several there, the last in the table), unless a
//   sized symbol below it reaches past it.

#include <elfutils/libdwfl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ebpf_metricsd::profiling {

class SymbolIndex {
 public:
  // Reads the symbol tables of `mod` (its own and any auxiliary one libdwfl found); names
  // point into libelf's copy of the strings, valid while the module's session lives.
  explicit SymbolIndex(Dwfl_Module* mod);
  // The name of the symbol that holds `addr` (an address in the module's terms, bias
  // included), or nullptr; its address into `start` where given.
  const char* at(std::uint64_t addr, std::uint64_t* start = nullptr) const;
  std::size_t symbols() const { return globals_.symbols.size() + locals_.symbols.size(); }
  // What the index holds, in bytes.
  std::size_t bytes() const;

 private:
  struct Symbol {
    std::uint64_t addr;
    std::uint64_t size;
    const char* name;
    std::uint8_t binding;
    std::uint32_t section;  // a label's: in sections_, or kExact (absolute: its address only)
  };
  struct Range {
    std::uint64_t start, end;
  };
  static constexpr std::uint32_t kExact = UINT32_MAX;
  bool in_section(const Symbol& label, std::uint64_t addr) const;
  struct Table {
    std::vector<Symbol> symbols;       // by address, table order among equals
    std::vector<std::uint64_t> reach;  // the highest end of symbols[0..i]
    void sort();
    // Its best candidates for `addr`, beside those of a table searched before.
    void search(const SymbolIndex& index, std::uint64_t addr, const Symbol*& sized,
                const Symbol*& label, std::uint64_t& min_label) const;
  };
  Table globals_, locals_;
  std::vector<Range> sections_;  // of the files' sections that labels are in
};

}  // namespace ebpf_metricsd::profiling
