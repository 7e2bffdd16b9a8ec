// MapReader::take_each on real hash maps: every entry handed over once with its value and
// taken out of the map, in the kernel's batches; at most the limit, the rest left in place.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>

#include "ebpf_metricsd/bpf/map_reader.h"

using namespace ebpf_metricsd;

namespace {
struct Value {
  std::uint64_t a;
  std::uint32_t b;
  std::uint32_t c;
};

int filled_map(bpf_map_type type, std::uint32_t entries, std::uint32_t max_entries) {
  const int fd =
      bpf_map_create(type, "emd_take", sizeof(std::uint64_t), sizeof(Value), max_entries, nullptr);
  REQUIRE(fd >= 0);
  for (std::uint64_t k = 1; k <= entries; ++k) {
    const Value v{k * 3, static_cast<std::uint32_t>(k), 7};
    REQUIRE(bpf_map_update_elem(fd, &k, &v, BPF_NOEXIST) == 0);
  }
  return fd;
}

std::size_t left_in(int fd) {
  std::uint64_t k = 0, next = 0;
  std::size_t n = 0;
  for (const void* at = nullptr; bpf_map_get_next_key(fd, at, &next) == 0; at = &k) {
    k = next;
    ++n;
  }
  return n;
}
}  // namespace

TEST_CASE("map take: every entry of a hash once, with its value, the map left empty",
          "[map_reader]") {
  for (const bpf_map_type type : {BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH}) {
    // More entries than one batch holds (256), the hash nearly full. An LRU hash evicts
    // before it is full: each CPU's free list holds up to 128 nodes the others cannot take,
    // so it gets that much room more per CPU, and none of the 1,000 is evicted.
    const auto room = static_cast<std::uint32_t>(
        type == BPF_MAP_TYPE_HASH ? 1024 : 1024 + 128 * libbpf_num_possible_cpus());
    const int fd = filled_map(type, 1000, room);
    std::map<std::uint64_t, Value> seen;
    const std::size_t taken = read_map_fd(fd, false)->take_each<std::uint64_t, Value>(
        room, [&](std::uint64_t k, const Value& v) { CHECK(seen.emplace(k, v).second); });
    CHECK(taken == 1000);
    REQUIRE(seen.size() == 1000);
    for (const auto& [k, v] : seen) {
      CHECK(v.a == k * 3);
      CHECK(v.b == k);
      CHECK(v.c == 7);
    }
    CHECK(left_in(fd) == 0);
    close(fd);
  }
}

TEST_CASE("map take: at most the limit, what is not taken left in the map", "[map_reader]") {
  const int fd = filled_map(BPF_MAP_TYPE_HASH, 300, 512);
  std::map<std::uint64_t, Value> seen;
  const std::size_t taken = read_map_fd(fd, false)->take_each<std::uint64_t, Value>(
      100, [&](std::uint64_t k, const Value& v) { seen.emplace(k, v); });
  CHECK(taken == seen.size());
  CHECK(taken <= 100);
  CHECK(taken >= 90);  // a batch stops before a bucket that does not fit
  CHECK(left_in(fd) == 300 - taken);
  for (const auto& [k, v] : seen) {
    Value there{};
    CHECK(bpf_map_lookup_elem(fd, &k, &there) != 0);
  }
  close(fd);
}
