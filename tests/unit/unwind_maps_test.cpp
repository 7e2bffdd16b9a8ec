// The walk's mappings as LPM trie blocks (profile/unwind_maps.h): the blocks of a range cover
// it exactly, each aligned to its size, in order, and few; rules are given back with the last
// table that uses them.
#include <endian.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

#include "ebpf_metricsd/profile/unwind_maps.h"

using namespace ebpf_metricsd::profiling;

TEST_CASE("unwind maps: a mapping's trie blocks cover it exactly", "[unwind_table]") {
  std::mt19937_64 rng(46);
  const auto check = [](std::uint32_t tgid, std::uint64_t start, std::uint64_t end) {
    INFO(std::hex << start << "-" << end);
    const auto blocks = mapping_blocks(tgid, start, end);
    std::uint64_t at = start;
    for (const auto& k : blocks) {
      REQUIRE(be32toh(k.tgid) == tgid);
      REQUIRE(k.prefixlen > 32);
      REQUIRE(k.prefixlen <= 32 + 64);
      const unsigned bits = 64 - (k.prefixlen - 32);
      const std::uint64_t size = bits == 64 ? 0 : std::uint64_t{1} << bits;
      const std::uint64_t addr = be64toh(k.addr);
      REQUIRE(addr == at);                // in order, no gap, no overlap
      REQUIRE((addr & (size - 1)) == 0);  // aligned to its size
      at += size;
    }
    CHECK(at == end);
    CHECK(blocks.size() <= 2 * 64);
  };
  check(1, 0x400000, 0x401000);              // one page
  check(2, 0x7f0000001000, 0x7f0000200000);  // a library's text, not aligned
  check(3, 0x1000, 0x7ffffffff000);          // nearly all of user space
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t a = (rng() % (std::uint64_t{1} << 47)) & ~std::uint64_t{0xfff};
    const std::uint64_t len = ((rng() % (std::uint64_t{1} << 30)) & ~std::uint64_t{0xfff}) + 4096;
    check(static_cast<std::uint32_t>(rng()), a, a + len);
  }
}

// Rules are shared by every table that uses them and freed with the last: a host that loads
// and drops files for weeks never runs out of them. Makes BPF maps: root only.
TEST_CASE("unwind maps: rules no loaded table uses are given back", "[unwind_table]") {
  if (geteuid() != 0) {
    WARN("skipped: making BPF maps needs root");
    return;
  }
  UnwindMapLimits limits;
  limits.mapping_blocks = 16;
  limits.processes = 16;
  limits.files = 16;
  limits.pages = 16;
  limits.rows = 64;
  limits.rules = 4;
  UnwindMaps maps(limits);
  const auto table_of = [](std::int32_t first_offset) {
    UnwindTable t;
    for (std::int32_t i = 0; i < 3; ++i) {
      UnwindRule r;
      r.kind = EMD_UNWIND_CFA_RSP;
      r.cfa_offset = first_offset + 8 * i;
      r.ra_offset = -8;
      t.rules.push_back(r);
      t.rows.push_back({static_cast<std::uint16_t>(16 * i), static_cast<std::uint16_t>(i)});
    }
    t.pages.push_back({1, 0, 3});
    return t;
  };
  REQUIRE(maps.load(1, table_of(8)) == UnwindMaps::Loaded::Ok);
  // The same rules again: shared, nothing new.
  REQUIRE(maps.load(2, table_of(8)) == UnwindMaps::Loaded::Ok);
  CHECK(maps.usage().rules == 3);
  // Three others: one index left of four.
  CHECK(maps.load(3, table_of(64)) == UnwindMaps::Loaded::RulesFull);
  maps.unload(1);
  CHECK(maps.load(3, table_of(64)) == UnwindMaps::Loaded::RulesFull);  // file 2 uses them
  maps.unload(2);
  CHECK(maps.usage().rules == 0);
  // Free once no walk can be reading them.
  CHECK(maps.load(3, table_of(64)) == UnwindMaps::Loaded::RulesFull);
  std::this_thread::sleep_for(UnwindMaps::kGrace + std::chrono::milliseconds(100));
  CHECK(maps.load(3, table_of(64)) == UnwindMaps::Loaded::Ok);
  CHECK(maps.usage().rules == 3);
}

TEST_CASE("unwind maps: no file takes more than half of the rows", "[unwind_table]") {
  if (geteuid() != 0) {
    WARN("skipped: making BPF maps needs root");
    return;
  }
  UnwindMapLimits limits;
  limits.mapping_blocks = limits.processes = limits.files = limits.pages = 16;
  limits.rows = 64;
  limits.rules = 4;
  UnwindMaps maps(limits);
  const auto table_of = [](std::uint16_t rows) {
    UnwindTable t;
    UnwindRule r;
    r.kind = EMD_UNWIND_CFA_RSP;
    r.cfa_offset = 8;
    r.ra_offset = -8;
    t.rules.push_back(r);
    for (std::uint16_t i = 0; i < rows; ++i) t.rows.push_back({static_cast<std::uint16_t>(i), 0});
    t.pages.push_back({1, 0, rows});
    return t;
  };
  // 33 of 64 rows: refused, though the rows are free; 32 fit, and the other 32 are left for
  // the rest of the host's files.
  CHECK(maps.load(1, table_of(33)) == UnwindMaps::Loaded::RowsFull);
  CHECK(maps.usage().rows == 0);
  CHECK(maps.load(1, table_of(32)) == UnwindMaps::Loaded::Ok);
  CHECK(maps.load(2, table_of(32)) == UnwindMaps::Loaded::Ok);
  CHECK(maps.load(3, table_of(2)) == UnwindMaps::Loaded::RowsFull);
  CHECK(maps.usage().rows == 64);
}

// A full trie: a block whose file changed is written again (not left naming the old file,
// as an update in place that a full trie refuses before Linux 6.13 would), and a write that
// fell short is made whole by the next read's rewrite once there is room. Makes BPF maps:
// root only.
TEST_CASE("unwind maps: a full trie never names another file's frames", "[unwind_table]") {
  if (geteuid() != 0) {
    WARN("skipped: making BPF maps needs root");
    return;
  }
  const MappedRange lib{0x7f0000000000, 0x7f0000010000, 1, 0x7f0000000000, 0x7f0000000000};
  const MappedRange exe{0x400000, 0x401000, 2, 0, 0x400000};
  const MappedRange more{0x500000, 0x501000, 4, 0, 0x500000};
  const MappedRange elsewhere{0x600000, 0x601000, 5, 0, 0x600000};  // another process's
  UnwindMapLimits limits;
  limits.mapping_blocks = static_cast<std::uint32_t>(
      mapping_blocks(7, lib.start, lib.end).size() + mapping_blocks(7, exe.start, exe.end).size() +
      mapping_blocks(9, elsewhere.start, elsewhere.end).size());
  limits.processes = limits.files = limits.pages = 16;
  limits.rows = 64;
  limits.rules = 4;
  UnwindMaps maps(limits);
  REQUIRE(maps.write_mappings(9, {}, {elsewhere}));
  REQUIRE(maps.write_mappings(7, {}, {lib, exe}));  // the trie is full
  CHECK(maps.file_at(7, lib.start + 0x100) == 1);
  // Another library at the same place.
  MappedRange other = lib;
  other.file = 3;
  CHECK(maps.write_mappings(7, {lib, exe}, {other, exe}));
  CHECK(maps.file_at(7, lib.start + 0x100) == 3);
  CHECK(maps.file_at(7, exe.start) == 2);
  // More than fits: short, and what is missing names nothing.
  CHECK_FALSE(maps.write_mappings(7, {other, exe}, {other, exe, more}));
  CHECK(maps.file_at(7, more.start) == 0);
  // Room made (the other process gone); the next read finds the same ranges and rewrites.
  REQUIRE(maps.write_mappings(9, {elsewhere}, {}));
  CHECK(maps.write_mappings(7, {other, exe, more}, {other, exe, more}, /*rewrite=*/true));
  CHECK(maps.file_at(7, more.start) == 4);
  CHECK(maps.file_at(7, other.start + 0x100) == 3);
  CHECK(maps.file_at(7, exe.start) == 2);
}
