#pragma once
// Tables that stand in for the kernel while a MapTables lives (KernelStandIn): a tracer built
// then sets its objects up without loading them, and every map its drain reads is read from
// here, by the map's name. A per-CPU map's value has one copy per CPU (`cpus` of them).
#include <bpf/libbpf.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/map_reader.h"

namespace ebpf_metricsd::test {

class MapTables final : public KernelStandIn {
 public:
  explicit MapTables(std::size_t cpus = 3) : cpus_(cpus) { set_kernel_stand_in(this); }
  ~MapTables() override { set_kernel_stand_in(nullptr); }
  MapTables(const MapTables&) = delete;
  MapTables& operator=(const MapTables&) = delete;

  // Sets the copy of `cpu` (0 for a map that is not per-CPU) of key's value in map `name`.
  template <class Key, class Value>
  void set(const std::string& name, const Key& key, const Value& value, std::size_t cpu = 0) {
    Table& t = tables_[name];
    const std::size_t stride = (sizeof(Value) + 7) / 8 * 8;
    auto& row = t.rows[bytes(key)];
    row.resize(cpus_ * stride);
    if (cpu >= cpus_) throw std::out_of_range("MapTables: no such CPU");
    std::memcpy(row.data() + cpu * stride, &value, sizeof value);
  }
  template <class Key>
  bool has(const std::string& name, const Key& key) const {
    const auto t = tables_.find(name);
    return t != tables_.end() && t->second.rows.count(bytes(key));
  }

  std::unique_ptr<MapReader> reader(const bpf_map* map) override {
    const bool per_cpu = bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_ARRAY ||
                         bpf_map__type(map) == BPF_MAP_TYPE_PERCPU_HASH ||
                         bpf_map__type(map) == BPF_MAP_TYPE_LRU_PERCPU_HASH;
    return std::make_unique<Reader>(tables_[bpf_map__name(map)], per_cpu ? cpus_ : 1,
                                    bpf_map__key_size(map), bpf_map__value_size(map));
  }

 private:
  struct Table {
    std::map<std::vector<std::uint8_t>, std::vector<std::uint8_t>> rows;
  };
  template <class Key>
  static std::vector<std::uint8_t> bytes(const Key& key) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&key);
    return {p, p + sizeof key};
  }

  class Reader final : public MapReader {
   public:
    Reader(Table& t, std::size_t copies, std::size_t key_size, std::size_t value_size)
        : t_(t), copies_(copies), key_size_(key_size), stride_((value_size + 7) / 8 * 8) {}
    std::size_t copies() const override { return copies_; }
    std::vector<std::uint8_t> read_array(std::uint32_t entries, std::size_t) override {
      std::vector<std::uint8_t> out(entries * copies_ * stride_);
      for (std::uint32_t k = 0; k < entries; ++k) copy(&k, out.data() + k * copies_ * stride_);
      return out;
    }
    bool next_key(const void* key, void* next) override {
      auto it = key ? t_.rows.upper_bound(as_key(key)) : t_.rows.begin();
      if (it == t_.rows.end()) return false;
      std::memcpy(next, it->first.data(), key_size_);
      return true;
    }
    bool lookup(const void* key, void* value) override { return copy(key, value); }
    Taken lookup_and_delete(const void* key, void* value) override {
      if (!copy(key, value)) return Taken::Absent;
      t_.rows.erase(as_key(key));
      return Taken::Yes;
    }
    bool remove(const void* key) override { return t_.rows.erase(as_key(key)) > 0; }

   private:
    std::vector<std::uint8_t> as_key(const void* key) const {
      const auto* p = static_cast<const std::uint8_t*>(key);
      return {p, p + key_size_};
    }
    // The key's value, zeros where a copy or the row was never set.
    bool copy(const void* key, void* value) const {
      auto* out = static_cast<std::uint8_t*>(value);
      std::memset(out, 0, copies_ * stride_);
      const auto it = t_.rows.find(as_key(key));
      if (it == t_.rows.end()) return false;
      std::memcpy(out, it->second.data(), std::min(it->second.size(), copies_ * stride_));
      return true;
    }
    Table& t_;
    std::size_t copies_, key_size_, stride_;
  };

  std::size_t cpus_;
  std::map<std::string, Table> tables_;
};

}  // namespace ebpf_metricsd::test
