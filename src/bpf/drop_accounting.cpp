#include "ebpf_metricsd/bpf/drop_accounting.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/types.h>

#include <map>
#include <mutex>
#include <string_view>

namespace ebpf_metricsd {

namespace {
// The shared drop maps, by map name.
std::map<std::string, std::vector<std::string>>& shared_drops() {
  static std::map<std::string, std::vector<std::string>> tables;
  return tables;
}
std::mutex& shared_drops_mutex() {
  static std::mutex m;
  return m;
}
// Whether a map of this name counts drops of a shared header (emd_*_drops, emd_*_ends).
bool shared_drop_name(std::string_view name) {
  return name.starts_with("emd_") && (name.ends_with("_drops") || name.ends_with("_ends"));
}
}  // namespace

void register_shared_drops(std::string map, std::vector<std::string> reasons) {
  std::lock_guard lock(shared_drops_mutex());
  shared_drops()[std::move(map)] = std::move(reasons);
}

DropAccounting::DropAccounting(MetricScope& scope, std::vector<std::string> reasons,
                               std::string swept_reason)
    : scope_(scope), reasons_(std::move(reasons)), swept_reason_(std::move(swept_reason)) {
  if (!swept_reason_.empty()) scope_.add_dropped(swept_reason_, 0);
  // Zero series up front, so "no drops" is visible rather than absent.
  for (const auto& r : reasons_) {
    if (!r.empty()) scope_.add_dropped(r, 0);
  }
  scope_.add_dropped("recursion", 0);
}

void DropAccounting::bind(const bpf_object* obj, const std::vector<ProgramChoice>& programs) {
  tables_.clear();
  if (const bpf_map* drops = bpf_object__find_map_by_name(obj, "drops"))
    tables_.push_back({drops, reasons_});
  const bpf_map* map = nullptr;
  bpf_object__for_each_map(map, obj) {
    const std::string name = bpf_map__name(map);
    if (!shared_drop_name(name)) continue;
    std::vector<std::string> reasons;
    {
      std::lock_guard lock(shared_drops_mutex());
      auto it = shared_drops().find(name);
      if (it == shared_drops().end())
        throw BpfError("the drop map " + name +
                       " has no reasons registered (register_shared_drops)");
      reasons = it->second;
    }
    if (bpf_map__max_entries(map) < reasons.size())
      throw BpfError("the drop map " + name + " has fewer entries than its reasons");
    for (const auto& r : reasons) {
      if (!r.empty()) scope_.add_dropped(r, 0);
    }
    tables_.push_back({map, std::move(reasons)});
  }
  prog_fds_.clear();
  for (const auto& p : programs) {
    // Not loaded (a stand-in for the kernel): no misses to read.
    if (p.wanted && bpf_program__fd(p.prog) >= 0) prog_fds_.push_back(bpf_program__fd(p.prog));
  }
}

void DropAccounting::drain() {
  for (Table& t : tables_) {
    t.deltas.drain_array(t.map, static_cast<std::uint32_t>(t.reasons.size()),
                         [&](const void* key, const std::uint64_t* delta) {
                           const auto& reason = t.reasons[*static_cast<const std::uint32_t*>(key)];
                           if (!reason.empty()) scope_.add_dropped(reason, delta[0]);
                         });
  }
  // The kernel skips a program that would re-enter itself on one CPU (e.g. from NMI) and
  // counts that as a recursion miss: an event this tracer did not see.
  std::uint64_t misses = 0;
  for (int fd : prog_fds_) {
    bpf_prog_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) misses += info.recursion_misses;
  }
  if (misses > last_misses_) scope_.add_dropped("recursion", misses - last_misses_);
  last_misses_ = misses;
}

void DropAccounting::sweep(const bpf_map* stamps, std::chrono::nanoseconds max_age) {
  if (const auto n = sweep_stale_stamps(stamps, max_age)) {
    scope_.add_dropped(swept_reason_, n);
  }
}

}  // namespace ebpf_metricsd
