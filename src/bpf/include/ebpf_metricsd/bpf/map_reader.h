#pragma once
// Every read of a BPF map that turns it into series goes through a MapReader: the kernel's
// map, or, in unit tests, a table that stands in for it (tests/unit/map_tables.h), so that the
// drains and each tracer's decoding of keys into labels are tested without root or a kernel
// (docs/testing.md).

#include <bpf/libbpf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace ebpf_metricsd {

class MapReader {
 public:
  virtual ~MapReader() = default;
  // How many copies each value has: one per possible CPU in a per-CPU map, else one.
  virtual std::size_t copies() const = 0;
  // The values of keys 0 .. entries-1 of an array: for each key, copies() values of
  // value_size bytes, each padded to 8 bytes, as the kernel lays out per-CPU values.
  virtual std::vector<std::uint8_t> read_array(std::uint32_t entries, std::size_t value_size) = 0;
  // The key after `key` (nullptr: the first) into `next`; false past the last.
  virtual bool next_key(const void* key, void* next) = 0;
  // The keys of a hash map as they are now, key_size bytes each, end to end: the one walk
  // every read of keys uses. At most `limit` (the map's max_entries): a key deleted during
  // the walk sends the kernel back to the first key, so a map whose keys come and go is
  // walked a bounded number of steps, never for ever (a key may then come twice). Throws
  // BpfError when the kernel refuses the walk.
  std::vector<std::uint8_t> keys(std::size_t key_size, std::size_t limit);
  template <class Key>
  std::vector<Key> keys(std::size_t limit) {
    const std::vector<std::uint8_t> bytes = keys(sizeof(Key), limit);
    std::vector<Key> out(bytes.size() / sizeof(Key));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(Key));
    return out;
  }
  // Takes every entry out of a hash map that is not per-CPU, at most `limit`, and hands each
  // to `visit` (its key and value, key_size and value_size bytes): each entry one step of the
  // kernel's, looked up and deleted together. In batches where the kernel takes them (5.6):
  // three system calls an entry fewer, and a batch's room of memory. Else by the key walk.
  // Returns how many it took; throws BpfError when the kernel refuses the walk.
  using Visit = std::function<void(const std::uint8_t* key, const std::uint8_t* value)>;
  std::size_t take_each(std::size_t key_size, std::size_t value_size, std::size_t limit,
                        const Visit& visit);
  template <class Key, class Value, class Fn>
  std::size_t take_each(std::size_t limit, Fn&& fn) {
    return take_each(sizeof(Key), sizeof(Value), limit,
                     [&](const std::uint8_t* key, const std::uint8_t* value) {
                       Key k;
                       Value v;
                       std::memcpy(&k, key, sizeof k);
                       std::memcpy(&v, value, sizeof v);
                       fn(k, v);
                     });
  }
  // The value (every copy) of `key` into `value`; false when there is no such key.
  virtual bool lookup(const void* key, void* value) = 0;
  // Takes `key` out of the map with its value in one step.
  enum class Taken { Yes, Absent, Unsupported };
  virtual Taken lookup_and_delete(const void* key, void* value) = 0;
  // Deletes `key`; false when it was not there.
  virtual bool remove(const void* key) = 0;

 protected:
  // take_each's batches: adds how many entries it handed to `visit` to `taken`; false where
  // the kernel has no batches for the map (then it took none).
  virtual bool take_batches(std::size_t key_size, std::size_t value_size, std::size_t limit,
                            const Visit& visit, std::size_t& taken);
};

// The reader of `map`, of a loaded object (or of one a stand-in set up).
std::unique_ptr<MapReader> read_map(const bpf_map* map);
// The kernel's reader of the map behind `fd`, a per-CPU map when `per_cpu`.
std::unique_ptr<MapReader> read_map_fd(int fd, bool per_cpu);

// What stands in for the kernel in unit tests: while one is set, read_map() hands out its
// readers, and LoadedSkeleton opens and sets objects up without loading or attaching them
// (perf events are not opened either): nothing reaches the kernel.
class KernelStandIn {
 public:
  virtual ~KernelStandIn() = default;
  virtual std::unique_ptr<MapReader> reader(const bpf_map* map) = 0;
};
// Sets (or with nullptr clears) the stand-in; for tests only.
void set_kernel_stand_in(KernelStandIn* stand_in);
KernelStandIn* kernel_stand_in();

}  // namespace ebpf_metricsd
