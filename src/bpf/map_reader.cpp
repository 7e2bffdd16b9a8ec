#include "ebpf_metricsd/bpf/map_reader.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

namespace {

std::atomic<KernelStandIn*> g_stand_in{nullptr};

bool is_per_cpu(const bpf_map* map) {
  switch (bpf_map__type(map)) {
    case BPF_MAP_TYPE_PERCPU_ARRAY:
    case BPF_MAP_TYPE_PERCPU_HASH:
    case BPF_MAP_TYPE_LRU_PERCPU_HASH:
      return true;
    default:
      return false;
  }
}

class KernelMapReader final : public MapReader {
 public:
  KernelMapReader(int fd, bool per_cpu)
      : fd_(fd), copies_(per_cpu ? static_cast<std::size_t>(possible_cpus()) : 1) {}

  std::size_t copies() const override { return copies_; }

  std::vector<std::uint8_t> read_array(std::uint32_t entries, std::size_t value_size) override {
    if (copies_ > 1) return read_percpu_array_bytes(fd_, entries, value_size, batch_);
    const std::size_t stride = (value_size + 7) / 8 * 8;
    std::vector<std::uint8_t> values(entries * stride);
    for (std::uint32_t k = 0; k < entries; ++k) {
      if (bpf_map_lookup_elem(fd_, &k, values.data() + k * stride) != 0)
        throw BpfError(bpf_error_text("bpf_map_lookup_elem", errno));
    }
    return values;
  }

  bool next_key(const void* key, void* next) override {
    if (bpf_map_get_next_key(fd_, key, next) == 0) return true;
    if (errno != ENOENT) throw BpfError(bpf_error_text("bpf_map_get_next_key", errno));
    return false;
  }

  bool lookup(const void* key, void* value) override {
    if (bpf_map_lookup_elem(fd_, key, value) == 0) return true;
    if (errno != ENOENT) throw BpfError(bpf_error_text("bpf_map_lookup_elem", errno));
    return false;
  }

  Taken lookup_and_delete(const void* key, void* value) override {
    if (bpf_map_lookup_and_delete_elem(fd_, key, value) == 0) return Taken::Yes;
    // EINVAL / ENOTSUPP: not for this map type on this kernel (before 5.14 for hashes).
    return errno == ENOENT ? Taken::Absent : Taken::Unsupported;
  }

  bool remove(const void* key) override { return bpf_map_delete_elem(fd_, key) == 0; }

 protected:
  bool take_batches(std::size_t key_size, std::size_t value_size, std::size_t limit,
                    const Visit& visit, std::size_t& taken) override {
    if (copies_ > 1 || batch_ == BatchReads::Unsupported) return false;
    std::size_t room = std::min<std::size_t>(limit, 256);
    std::vector<std::uint8_t> keys, values;
    __u64 at = 0;  // where the last batch ended (a hash map: a bucket)
    bool first = true;
    while (taken < limit) {
      room = std::min(room, limit - taken);
      keys.resize(room * key_size);
      values.resize(room * value_size);
      auto count = static_cast<__u32>(room);
      const int err = bpf_map_lookup_and_delete_batch(fd_, first ? nullptr : &at, &at, keys.data(),
                                                      values.data(), &count, nullptr);
      const int why = err != 0 ? errno : 0;
      // EINVAL / ENOTSUPP / EOPNOTSUPP at the first: no batches for this map on this kernel.
      if (first && err != 0 && (why == EINVAL || why == 524 || why == EOPNOTSUPP)) {
        batch_ = BatchReads::Unsupported;
        return false;
      }
      first = false;
      batch_ = BatchReads::Supported;
      for (__u32 i = 0; i < count && i < room; ++i)
        visit(keys.data() + i * key_size, values.data() + i * value_size);
      taken += std::min<std::size_t>(count, room);
      if (err == 0) continue;
      if (why == ENOENT) break;  // past the last bucket, its entries taken
      if (why == ENOSPC && count == 0) {
        // One bucket holds more entries than there was room for; past the limit (entries
        // added while the map is taken), the rest waits for the next read.
        if (room >= limit - taken) break;
        room *= 2;
        continue;
      }
      throw BpfError(bpf_error_text("bpf_map_lookup_and_delete_batch", why));
    }
    return true;
  }

 private:
  int fd_;
  std::size_t copies_;
  BatchReads batch_ = BatchReads::Unknown;
};

}  // namespace

std::vector<std::uint8_t> MapReader::keys(std::size_t key_size, std::size_t limit) {
  std::vector<std::uint8_t> out;
  std::vector<std::uint8_t> next(key_size);
  for (std::size_t n = 0; n < limit; ++n) {
    const void* prev = n == 0 ? nullptr : out.data() + (n - 1) * key_size;
    if (!next_key(prev, next.data())) break;
    out.insert(out.end(), next.begin(), next.end());
  }
  return out;
}

bool MapReader::take_batches(std::size_t, std::size_t, std::size_t, const Visit&, std::size_t&) {
  return false;
}

std::size_t MapReader::take_each(std::size_t key_size, std::size_t value_size, std::size_t limit,
                                 const Visit& visit) {
  if (copies() > 1) throw BpfError("take_each: a per-CPU map's values are not one copy each");
  std::size_t taken = 0;
  if (take_batches(key_size, value_size, limit, visit, taken)) return taken;
  const std::vector<std::uint8_t> all = keys(key_size, limit);
  std::vector<std::uint8_t> value(value_size);
  for (std::size_t i = 0; i < all.size() / key_size; ++i) {
    const std::uint8_t* key = all.data() + i * key_size;
    const Taken got = lookup_and_delete(key, value.data());
    if (got == Taken::Absent) continue;
    if (got == Taken::Unsupported && !(lookup(key, value.data()) && remove(key))) continue;
    visit(key, value.data());
    ++taken;
  }
  return taken;
}

std::unique_ptr<MapReader> read_map(const bpf_map* map) {
  if (KernelStandIn* s = g_stand_in.load()) return s->reader(map);
  return std::make_unique<KernelMapReader>(bpf_map__fd(map), is_per_cpu(map));
}

std::unique_ptr<MapReader> read_map_fd(int fd, bool per_cpu) {
  return std::make_unique<KernelMapReader>(fd, per_cpu);
}

void set_kernel_stand_in(KernelStandIn* stand_in) { g_stand_in.store(stand_in); }
KernelStandIn* kernel_stand_in() { return g_stand_in.load(); }

}  // namespace ebpf_metricsd
