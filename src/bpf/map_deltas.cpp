#include "ebpf_metricsd/bpf/map_deltas.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <span>

#include "ebpf_metricsd/base/clock.h"

namespace ebpf_metricsd {

MapReader& PerCpuDeltas::reader(const bpf_map* map) {
  auto& r = readers_[map];
  if (!r) r = read_map(map);
  return *r;
}

bool PerCpuDeltas::account(const void* key, std::size_t key_size, std::size_t copies,
                           const std::uint64_t* per_cpu, const Visit& visit) {
  std::vector<std::uint64_t> total(width_, 0);
  for (std::size_t c = 0; c < copies; ++c) {
    for (std::size_t i = 0; i < width_; ++i) total[i] += per_cpu[c * width_ + i];
  }
  const auto* kb = static_cast<const std::uint8_t*>(key);
  std::vector<std::uint8_t> k(kb, kb + key_size);
  auto it = last_.find(k);
  if (it == last_.end())
    it = last_.emplace(std::move(k), std::vector<std::uint64_t>(width_, 0)).first;
  std::vector<std::uint64_t>& last = it->second;
  bool changed = false;
  std::vector<std::uint64_t> delta(width_);
  for (std::size_t i = 0; i < width_; ++i) {
    delta[i] = total[i] - last[i];
    changed |= delta[i] != 0;
  }
  if (!changed) return false;
  last = std::move(total);
  visit(key, delta.data());
  return true;
}

void PerCpuDeltas::drain_array(const bpf_map* map, std::uint32_t entries, const Visit& visit) {
  drain_array(reader(map), entries, visit);
}

void PerCpuDeltas::drain_hash(const bpf_map* map, std::size_t key_size, const Visit& visit,
                              const Retire& retire) {
  drain_hash(reader(map), key_size, bpf_map__max_entries(map), visit, retire);
}

void PerCpuDeltas::drain_array(MapReader& r, std::uint32_t entries, const Visit& visit) {
  const std::size_t copies = r.copies();
  const auto values = r.read_array(entries, width_ * 8);
  std::vector<std::uint64_t> per_cpu(copies * width_);
  for (std::uint32_t k = 0; k < entries; ++k) {
    std::memcpy(per_cpu.data(), values.data() + k * copies * width_ * 8, per_cpu.size() * 8);
    account(&k, sizeof k, copies, per_cpu.data(), visit);
  }
}

void PerCpuDeltas::drain_hash(MapReader& r, std::size_t key_size, std::size_t limit,
                              const Visit& visit, const Retire& retire) {
  const std::size_t copies = r.copies();
  std::vector<std::uint64_t> per_cpu(copies * width_);
  std::vector<std::vector<std::uint8_t>> retired;
  // The kernel side never deletes keys, so the walk sees each once.
  const std::vector<std::uint8_t> keys = r.keys(key_size, limit);
  for (std::size_t at = 0; at + key_size <= keys.size(); at += key_size) {
    const std::uint8_t* key = keys.data() + at;
    if (r.lookup(key, per_cpu.data()) && !account(key, key_size, copies, per_cpu.data(), visit) &&
        retire && retire(key))
      retired.emplace_back(key, key + key_size);
  }
  // After the walk, which a deletion would restart. The entry was idle for a whole drain
  // interval and its owner is gone. Taken out with its values in one step where the kernel
  // can (5.14+), so that what still came since the read above is counted too; elsewhere
  // deleted (an event between the read and the delete would be lost). An event after it
  // makes the entry anew.
  for (auto& k : retired) {
    bool gone = false;
    if (lookup_and_delete_) {
      switch (r.lookup_and_delete(k.data(), per_cpu.data())) {
        case MapReader::Taken::Yes:
          account(k.data(), key_size, copies, per_cpu.data(), visit);
          gone = true;
          break;
        case MapReader::Taken::Absent:
          gone = true;
          break;
        case MapReader::Taken::Unsupported:
          lookup_and_delete_ = false;
          break;
      }
    }
    if (!gone && !lookup_and_delete_)
      gone = r.remove(k.data()) || !r.lookup(k.data(), per_cpu.data());
    if (!gone) continue;  // still there: the next drain reads it again
    last_.erase(k);
    ++retired_;
  }
}

namespace {
std::size_t value_width(const std::vector<ValueColumn>& columns) {
  std::size_t width = 0;
  for (const ValueColumn& c : columns) width += c.slots ? c.slots + 1 : 1;
  return width;
}
}  // namespace

SeriesDrain::SeriesDrain(MetricScope& scope, std::vector<ValueColumn> columns)
    : scope_(scope), columns_(std::move(columns)), deltas_(value_width(columns_)) {}

PerCpuDeltas::Visit SeriesDrain::visitor(const Labels& labels) {
  return [this, &labels](const void* key, const std::uint64_t* delta) {
    const MetricStore::LabelValues values = labels(key);
    for (const ValueColumn& c : columns_) {
      MetricStore::LabelValues v = values;
      v.insert(v.end(), c.labels.begin(), c.labels.end());
      if (c.slots) {
        scope_.add_slots(c.metric, v, std::span<const std::uint64_t>(delta, c.slots),
                         delta[c.slots]);
        delta += c.slots + 1;
      } else {
        scope_.add(c.metric, v, *delta++);
      }
    }
  };
}

void SeriesDrain::drain_array(const bpf_map* map, std::uint32_t entries, const Labels& labels) {
  deltas_.drain_array(map, entries, visitor(labels));
}

void SeriesDrain::drain_hash(const bpf_map* map, std::size_t key_size, const Labels& labels,
                             const PerCpuDeltas::Retire& retire) {
  deltas_.drain_hash(map, key_size, visitor(labels), retire);
}

std::uint64_t sweep_stale_stamps(const bpf_map* map, std::chrono::nanoseconds max_age) {
  const std::uint64_t now_ns = monotonic_ns();
  const std::uint64_t limit = static_cast<std::uint64_t>(max_age.count());
  const auto r = read_map(map);
  // The stamp is the value's first u64 (some maps keep the event's owner after it).
  std::vector<std::uint64_t> value((std::max<std::uint32_t>(bpf_map__value_size(map), 8) + 7) / 8);
  std::vector<std::uint64_t> stale;
  for (std::uint64_t key : r->keys<std::uint64_t>(bpf_map__max_entries(map))) {
    if (r->lookup(&key, value.data())) {
      const std::uint64_t stamp = value[0];
      if (stamp != 0 && stamp < now_ns && now_ns - stamp > limit) stale.push_back(key);
    }
  }
  std::uint64_t deleted = 0;
  for (std::uint64_t k : stale) {
    // The end event may have raced us and removed it already; only what we delete counts.
    if (r->remove(&k)) ++deleted;
  }
  return deleted;
}

}  // namespace ebpf_metricsd
