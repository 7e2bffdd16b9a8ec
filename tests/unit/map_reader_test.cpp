// The one walk of a hash map's keys (MapReader::keys): every key once, in the kernel's order,
// and bounded where keys deleted meanwhile send the kernel back to the first one; and the
// walk that takes every entry out (take_each) where the kernel has no batches.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "ebpf_metricsd/bpf/map_reader.h"

using namespace ebpf_metricsd;

namespace {
// A hash map of u32 keys as the kernel walks one: the key after a key that is not there is
// the first (what BPF_MAP_GET_NEXT_KEY does for a key deleted since).
class Keys final : public MapReader {
 public:
  explicit Keys(std::vector<std::uint32_t> keys) : keys_(std::move(keys)) {}
  std::size_t copies() const override { return 1; }
  std::vector<std::uint8_t> read_array(std::uint32_t, std::size_t) override { return {}; }
  bool next_key(const void* key, void* next) override {
    std::size_t at = 0;  // a key not there: the first
    if (key) {
      std::uint32_t k = 0;
      std::memcpy(&k, key, sizeof k);
      if (churn_) {
        // The kernel side deletes the key just walked past and adds another.
        std::erase(keys_, k);
        keys_.push_back(k + 100);
      }
      for (std::size_t i = 0; i < keys_.size(); ++i) {
        if (keys_[i] == k) at = i + 1;
      }
    }
    if (at >= keys_.size()) return false;
    std::memcpy(next, &keys_[at], sizeof keys_[at]);
    return true;
  }
  bool lookup(const void*, void*) override { return false; }
  Taken lookup_and_delete(const void*, void*) override { return Taken::Unsupported; }
  bool remove(const void*) override { return false; }
  bool churn_ = false;

 private:
  std::vector<std::uint32_t> keys_;
};
}  // namespace

TEST_CASE("map keys: every key once, in order", "[map_reader]") {
  Keys map({7, 3, 9, 1});
  CHECK(map.keys<std::uint32_t>(16) == std::vector<std::uint32_t>{7, 3, 9, 1});
  CHECK(map.keys<std::uint32_t>(2) == std::vector<std::uint32_t>{7, 3});
  CHECK(Keys({}).keys<std::uint32_t>(16).empty());
  const std::vector<std::uint8_t> bytes = map.keys(sizeof(std::uint32_t), 16);
  CHECK(bytes.size() == 4 * sizeof(std::uint32_t));
}

TEST_CASE("map keys: a walk that deletions send back to the first key ends", "[map_reader]") {
  // Every key walked past is deleted and another added: the kernel answers each step with the
  // first key, and the map never runs out. The walk stops at its limit, the map's size.
  Keys map({1, 2, 3, 4, 5, 6, 7, 8});
  map.churn_ = true;
  CHECK(map.keys<std::uint32_t>(8).size() == 8);
}

namespace {
// A map without the kernel's batches, nor lookup-and-delete in one step (before 5.14 for a
// hash): take_each walks its keys, then looks each up and deletes it.
class Table final : public MapReader {
 public:
  std::size_t copies() const override { return 1; }
  std::vector<std::uint8_t> read_array(std::uint32_t, std::size_t) override { return {}; }
  bool next_key(const void* key, void* next) override {
    auto it = rows_.begin();
    if (key) {
      std::uint32_t k = 0;
      std::memcpy(&k, key, sizeof k);
      it = rows_.upper_bound(k);
    }
    if (it == rows_.end()) return false;
    std::memcpy(next, &it->first, sizeof it->first);
    return true;
  }
  bool lookup(const void* key, void* value) override {
    std::uint32_t k = 0;
    std::memcpy(&k, key, sizeof k);
    const auto it = rows_.find(k);
    if (it == rows_.end()) return false;
    std::memcpy(value, &it->second, sizeof it->second);
    return true;
  }
  Taken lookup_and_delete(const void*, void*) override { return Taken::Unsupported; }
  bool remove(const void* key) override {
    std::uint32_t k = 0;
    std::memcpy(&k, key, sizeof k);
    return rows_.erase(k) > 0;
  }
  std::map<std::uint32_t, std::uint64_t> rows_;
};
}  // namespace

TEST_CASE("map take: without batches, each key looked up and deleted", "[map_reader]") {
  Table map;
  map.rows_ = {{1, 10}, {2, 20}, {5, 50}};
  std::map<std::uint32_t, std::uint64_t> seen;
  CHECK(map.take_each<std::uint32_t, std::uint64_t>(
            16, [&](std::uint32_t k, std::uint64_t v) { seen[k] = v; }) == 3);
  CHECK(seen == std::map<std::uint32_t, std::uint64_t>{{1, 10}, {2, 20}, {5, 50}});
  CHECK(map.rows_.empty());
  map.rows_ = {{1, 10}, {2, 20}, {5, 50}};
  CHECK(map.take_each<std::uint32_t, std::uint64_t>(2, [](std::uint32_t, std::uint64_t) {}) == 2);
  CHECK(map.rows_.size() == 1);
}
