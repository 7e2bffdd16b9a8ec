#include "ebpf_metricsd/bpf/drop_accounting.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/types.h>

// clang-format off
#include "common/slow.h"
#include "common/stacks.h"
#include "common/ustack.h"
// clang-format on

namespace ebpf_metricsd {

namespace {
// The drop maps of the headers objects share, by map name.
struct SharedDrops {
  const char* map;
  std::vector<std::string> reasons;
};
const std::vector<SharedDrops>& shared_drops() {
  static const std::vector<SharedDrops> tables = {
      {"emd_stack_drops",
       drop_reasons<EMD_STACK_DROP__COUNT>(
           {"stack_error", "stack_truncated", "stack_collision", "stack_not_kept"})},
      {"emd_ustack_drops",
       drop_reasons<EMD_USTACK_DROP__COUNT>({"ustack_no_regs", "ustack_unreadable", "ustack_budget",
                                             "ustack_ring_full", "ustack_worker"})},
      {"emd_slow_return_drops",
       drop_reasons<EMD_SLOW_RETURN__COUNT>({"slow_return_mismatch", "slow_return_exited",
                                             "slow_return_full", "slow_return_exec",
                                             "slow_return_second"})},
  };
  return tables;
}
}  // namespace

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
    tables_.push_back({drops, &reasons_});
  for (const SharedDrops& shared : shared_drops()) {
    const bpf_map* map = bpf_object__find_map_by_name(obj, shared.map);
    if (!map) continue;
    tables_.push_back({map, &shared.reasons});
    for (const auto& r : shared.reasons) scope_.add_dropped(r, 0);
  }
  prog_fds_.clear();
  for (const auto& p : programs) {
    // Not loaded (a stand-in for the kernel): no misses to read.
    if (p.wanted && bpf_program__fd(p.prog) >= 0) prog_fds_.push_back(bpf_program__fd(p.prog));
  }
}

void DropAccounting::drain() {
  for (Table& t : tables_) {
    t.deltas.drain_array(t.map, static_cast<std::uint32_t>(t.reasons->size()),
                         [&](const void* key, const std::uint64_t* delta) {
                           const auto& reason =
                               (*t.reasons)[*static_cast<const std::uint32_t*>(key)];
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
