#include "ebpf_metricsd/bpf/map_deltas.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <span>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

bool PerCpuDeltas::account(const void* key, std::size_t key_size, const std::uint64_t* per_cpu,
                           const Visit& visit) {
  const std::size_t cpus = static_cast<std::size_t>(possible_cpus());
  std::vector<std::uint64_t> total(width_, 0);
  for (std::size_t c = 0; c < cpus; ++c) {
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

void PerCpuDeltas::drain_array(int map_fd, std::uint32_t entries, const Visit& visit) {
  const auto values = read_percpu_array_bytes(map_fd, entries, width_ * 8, batch_);
  const std::size_t cpus = static_cast<std::size_t>(possible_cpus());
  std::vector<std::uint64_t> per_cpu(cpus * width_);
  for (std::uint32_t k = 0; k < entries; ++k) {
    std::memcpy(per_cpu.data(), values.data() + k * cpus * width_ * 8, per_cpu.size() * 8);
    account(&k, sizeof k, per_cpu.data(), visit);
  }
}

void PerCpuDeltas::drain_hash(int map_fd, std::size_t key_size, const Visit& visit,
                              const Retire& retire) {
  const std::size_t cpus = static_cast<std::size_t>(possible_cpus());
  std::vector<std::uint64_t> per_cpu(cpus * width_);
  std::vector<std::uint8_t> key(key_size), next(key_size);
  std::vector<std::vector<std::uint8_t>> retired;
  // The kernel side never deletes keys, so walking with get_next_key sees each once.
  int err = bpf_map_get_next_key(map_fd, nullptr, next.data());
  while (err == 0) {
    key = next;
    if (bpf_map_lookup_elem(map_fd, key.data(), per_cpu.data()) == 0) {
      if (!account(key.data(), key_size, per_cpu.data(), visit) && retire && retire(key.data()))
        retired.push_back(key);
    } else if (errno != ENOENT) {
      throw BpfError(bpf_error_text("bpf_map_lookup_elem", errno));
    }
    err = bpf_map_get_next_key(map_fd, key.data(), next.data());
  }
  if (errno != ENOENT) throw BpfError(bpf_error_text("bpf_map_get_next_key", errno));
  // After the walk, which a deletion would restart. The entry was idle for a whole drain
  // interval and its owner is gone. Taken out with its values in one step where the kernel
  // can (5.14+), so that what still came since the read above is counted too; elsewhere
  // deleted (an event between the read and the delete would be lost). An event after it
  // makes the entry anew.
  for (auto& k : retired) {
    bool gone = false;
    if (lookup_and_delete_ != Support::No) {
      if (bpf_map_lookup_and_delete_elem(map_fd, k.data(), per_cpu.data()) == 0) {
        lookup_and_delete_ = Support::Yes;
        account(k.data(), key_size, per_cpu.data(), visit);
        gone = true;
      } else if (errno == ENOENT) {
        gone = true;
      } else if (lookup_and_delete_ == Support::Unknown) {
        lookup_and_delete_ = Support::No;  // EINVAL / ENOTSUPP: not for this map type here
      }
    }
    if (!gone && lookup_and_delete_ == Support::No)
      gone = bpf_map_delete_elem(map_fd, k.data()) == 0 || errno == ENOENT;
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

void SeriesDrain::drain_array(int map_fd, std::uint32_t entries, const Labels& labels) {
  deltas_.drain_array(map_fd, entries, visitor(labels));
}

void SeriesDrain::drain_hash(int map_fd, std::size_t key_size, const Labels& labels,
                             const PerCpuDeltas::Retire& retire) {
  deltas_.drain_hash(map_fd, key_size, visitor(labels), retire);
}

std::uint64_t sweep_stale_stamps(int map_fd, std::chrono::nanoseconds max_age) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // the clock of bpf_ktime_get_ns()
  const std::uint64_t now_ns = static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ULL +
                               static_cast<std::uint64_t>(now.tv_nsec);
  const std::uint64_t limit = static_cast<std::uint64_t>(max_age.count());
  bpf_map_info info{};
  std::uint32_t len = sizeof info;
  if (bpf_obj_get_info_by_fd(map_fd, &info, &len) != 0)
    throw BpfError(bpf_error_text("bpf_obj_get_info_by_fd", errno));
  // The stamp is the value's first u64 (some maps keep the event's owner after it).
  std::vector<std::uint64_t> value((std::max<std::uint32_t>(info.value_size, 8) + 7) / 8);
  std::vector<std::uint64_t> stale;
  std::uint64_t key = 0, next = 0;
  int err = bpf_map_get_next_key(map_fd, nullptr, &next);
  while (err == 0) {
    key = next;
    if (bpf_map_lookup_elem(map_fd, &key, value.data()) == 0) {
      const std::uint64_t stamp = value[0];
      if (stamp != 0 && stamp < now_ns && now_ns - stamp > limit) stale.push_back(key);
    }
    err = bpf_map_get_next_key(map_fd, &key, &next);
  }
  std::uint64_t deleted = 0;
  for (std::uint64_t k : stale) {
    // The end event may have raced us and removed it already; only what we delete counts.
    if (bpf_map_delete_elem(map_fd, &k) == 0) ++deleted;
  }
  return deleted;
}

}  // namespace ebpf_metricsd
