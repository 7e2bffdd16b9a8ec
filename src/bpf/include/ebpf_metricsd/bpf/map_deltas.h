#pragma once

#include <bpf/libbpf.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "ebpf_metricsd/bpf/map_reader.h"
#include "ebpf_metricsd/metrics/metric_scope.h"

namespace ebpf_metricsd {

// Turns per-CPU BPF map values, which the kernel side only ever increments, into deltas
// since the previous drain. A value is `width` u64s; per key, the CPUs are summed first.
// Every increment is seen exactly once: what a drain misses (a CPU updating while it
// reads) is still in the map, and so in the next delta. Maps are read through MapReader.
class PerCpuDeltas {
 public:
  explicit PerCpuDeltas(std::size_t width) : width_(width) {}

  using Visit = std::function<void(const void* key, const std::uint64_t* delta)>;
  // Visits every key of a PERCPU_ARRAY whose value changed.
  void drain_array(const bpf_map* map, std::uint32_t entries, const Visit& visit);
  // Whether an unchanged key's entry is to be deleted from the map (its owner is gone).
  using Retire = std::function<bool(const void* key)>;
  // Visits every key of a PERCPU_HASH whose value changed; deletes the entries of
  // unchanged keys that `retire` names, so that a map keyed by short-lived owners (cgroups)
  // does not fill up with the dead.
  void drain_hash(const bpf_map* map, std::size_t key_size, const Visit& visit,
                  const Retire& retire = {});
  // The same, from a reader of the map; `limit`: the map's max_entries.
  void drain_array(MapReader& map, std::uint32_t entries, const Visit& visit);
  void drain_hash(MapReader& map, std::size_t key_size, std::size_t limit, const Visit& visit,
                  const Retire& retire = {});
  // Entries deleted so far by drain_hash.
  std::uint64_t retired() const { return retired_; }

 private:
  MapReader& reader(const bpf_map* map);
  // Returns whether the key's value changed.
  bool account(const void* key, std::size_t key_size, std::size_t copies,
               const std::uint64_t* per_cpu, const Visit& visit);
  std::size_t width_;
  std::uint64_t retired_ = 0;
  bool lookup_and_delete_ = true;  // of per-CPU hashes, by this kernel, until it says no
  std::map<const bpf_map*, std::unique_ptr<MapReader>> readers_;
  std::map<std::vector<std::uint8_t>, std::vector<std::uint64_t>> last_;
};

// How a column of a map's value becomes series: one u64 added to a counter, or, for a
// histogram, `slots` u64 slots and the sum after them; under the key's label values and
// then the column's own (`labels`, e.g. kind="requested").
struct ValueColumn {
  MetricScope::Metric metric;
  std::size_t slots = 0;  // 0: a counter
  MetricStore::LabelValues labels = {};
};

// A per-CPU map whose value is `columns` side by side, drained into their metrics: per key,
// what was added since the last drain, under the label values `labels(key)` gives.
class SeriesDrain {
 public:
  SeriesDrain(MetricScope& scope, std::vector<ValueColumn> columns);
  using Labels = std::function<MetricStore::LabelValues(const void* key)>;
  void drain_array(const bpf_map* map, std::uint32_t entries, const Labels& labels);
  void drain_hash(const bpf_map* map, std::size_t key_size, const Labels& labels,
                  const PerCpuDeltas::Retire& retire = {});

 private:
  PerCpuDeltas::Visit visitor(const Labels& labels);
  MetricScope& scope_;
  std::vector<ValueColumn> columns_;
  PerCpuDeltas deltas_;
};

// For maps of things in flight (a u64 key, a value that starts with a u64
// bpf_ktime_get_ns() stamp) whose end event may never come (a dropped packet, a request of
// a removed disk): deletes entries older than `max_age` and returns how many, so they can
// be counted, not leaked.
std::uint64_t sweep_stale_stamps(const bpf_map* map, std::chrono::nanoseconds max_age);

}  // namespace ebpf_metricsd
