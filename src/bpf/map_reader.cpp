#include "ebpf_metricsd/bpf/map_reader.h"

#include <bpf/bpf.h>

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
