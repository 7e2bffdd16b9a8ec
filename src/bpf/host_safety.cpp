#include "ebpf_metricsd/bpf/host_safety.h"

#include <bpf/btf.h>
#include <linux/bpf.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

namespace {

bool struct_has_member(const btf* b, const char* type, const char* member) {
  const int id = btf__find_by_name_kind(b, type, BTF_KIND_STRUCT);
  if (id < 0) return false;
  const btf_type* t = btf__type_by_id(b, static_cast<__u32>(id));
  const btf_member* m = btf_members(t);
  for (int i = 0; i < btf_vlen(t); ++i) {
    const char* name = btf__name_by_offset(b, m[i].name_off);
    if (name && std::string_view(name) == member) return true;
  }
  return false;
}

bool is_hash(bpf_map_type type) {
  return type == BPF_MAP_TYPE_HASH || type == BPF_MAP_TYPE_PERCPU_HASH ||
         type == BPF_MAP_TYPE_LRU_HASH || type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
}

bool is_percpu(bpf_map_type type) {
  return type == BPF_MAP_TYPE_PERCPU_HASH || type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
}

std::size_t round8(std::size_t n) { return (n + 7) / 8 * 8; }

// What the kernel allocates for a preallocated hash map: every element (its header, key and
// value, per-CPU values for every possible CPU) at creation.
std::size_t preallocated_size(const bpf_map* map) {
  constexpr std::size_t kElementHeader = 48;  // struct htab_elem before the key
  const std::size_t values =
      is_percpu(bpf_map__type(map))
          ? round8(bpf_map__value_size(map)) * static_cast<std::size_t>(possible_cpus())
          : round8(bpf_map__value_size(map));
  return bpf_map__max_entries(map) * (kElementHeader + round8(bpf_map__key_size(map)) + values);
}

// Local storage of every kind (task, socket, inode, cgroup) takes its elements from the
// same allocator.
// bpf_cgrp_storage_get (6.2) is newer than the build's kernel headers: it follows
// bpf_user_ringbuf_drain in the kernel's helper list.
constexpr int kCgrpStorageGet = BPF_FUNC_user_ringbuf_drain + 1;
constexpr std::array<int, 4> kStorageGetHelpers = {BPF_FUNC_task_storage_get,
                                                   BPF_FUNC_sk_storage_get,
                                                   BPF_FUNC_inode_storage_get, kCgrpStorageGet};

// The helpers a program on a scheduler hook may call besides the local-storage ones (judged
// by the storage rule: whether local storage may allocate there): none allocates (maps are
// preallocated where the kernel's hash maps would allocate), sleeps, or wakes a task
// directly (a ring buffer or perf buffer wakes its reader through irq_work, later, not under
// the locks). Each was read in the kernels the daemon supports (5.10 .. newest). Anything
// else, say bpf_send_signal (it takes the target's sighand lock and may wake it), is refused
// there: a helper is added here only with its reason.
constexpr std::array<int, 31> kSchedulerHelpers = {
    BPF_FUNC_map_lookup_elem,
    BPF_FUNC_map_update_elem,
    BPF_FUNC_map_delete_elem,
    BPF_FUNC_probe_read,
    BPF_FUNC_probe_read_str,
    BPF_FUNC_probe_read_kernel,
    BPF_FUNC_probe_read_kernel_str,
    // With page faults disabled: a page not resident is an error, never a fault taken.
    BPF_FUNC_probe_read_user,
    BPF_FUNC_probe_read_user_str,
    BPF_FUNC_ktime_get_ns,
    BPF_FUNC_ktime_get_boot_ns,
    BPF_FUNC_ktime_get_coarse_ns,
    BPF_FUNC_jiffies64,
    BPF_FUNC_get_prandom_u32,
    BPF_FUNC_get_smp_processor_id,
    BPF_FUNC_get_current_pid_tgid,
    BPF_FUNC_get_current_uid_gid,
    BPF_FUNC_get_current_comm,
    BPF_FUNC_get_current_task,
    BPF_FUNC_get_current_task_btf,
    BPF_FUNC_get_current_cgroup_id,
    BPF_FUNC_current_task_under_cgroup,
    BPF_FUNC_task_pt_regs,
    // Per-CPU callchain buffers taken at load; user stacks read with page faults disabled.
    BPF_FUNC_get_stack,
    BPF_FUNC_get_task_stack,
    BPF_FUNC_ringbuf_output,
    BPF_FUNC_ringbuf_reserve,
    BPF_FUNC_ringbuf_submit,
    BPF_FUNC_ringbuf_discard,
    BPF_FUNC_ringbuf_query,
    BPF_FUNC_perf_event_output,
};

template <std::size_t N>
bool one_of(const std::array<int, N>& helpers, int helper) {
  return std::find(helpers.begin(), helpers.end(), helper) != helpers.end();
}

// What an entry function calls: its helpers, in order, once each, and whether it calls a
// subprogram or hands a callback to a helper. Before load libbpf shows only the entry
// function's instructions (subprograms are appended at load), so what those call cannot be
// seen.
struct Calls {
  std::vector<int> helpers;
  bool out_of_sight = false;
};

Calls calls_of(const bpf_program* prog) {
  const bpf_insn* insns = bpf_program__insns(prog);
  const std::size_t n = bpf_program__insn_cnt(prog);
  Calls calls;
  for (std::size_t i = 0; i < n; ++i) {
    const bpf_insn& in = insns[i];
    if (in.code == (BPF_JMP | BPF_CALL) && in.src_reg == BPF_PSEUDO_CALL) calls.out_of_sight = true;
    if (in.code == (BPF_LD | BPF_IMM | BPF_DW) && in.src_reg == BPF_PSEUDO_FUNC)
      calls.out_of_sight = true;
    if (in.code == (BPF_JMP | BPF_CALL) && in.src_reg == 0 &&
        std::find(calls.helpers.begin(), calls.helpers.end(), in.imm) == calls.helpers.end())
      calls.helpers.push_back(in.imm);
  }
  return calls;
}

}  // namespace

KernelAllocators probe_kernel_allocators() {
  const auto vmlinux = kernel_btf();
  KernelAllocators k;
  if (!vmlinux) return k;
  // kmalloc_nolock() (6.18+) is safe in any context; BPF maps that left the BPF memory
  // allocator moved to it (local storage did in 7.x), so where it exists neither can reach
  // the page allocator's locks or wake a task from a program.
  // Its allocating half has had several names (kmalloc_nolock_noprof, _kmalloc_nolock_noprof);
  // kfree_nolock() came with it and kept its name.
  const bool nolock_kmalloc =
      btf__find_by_name_kind(vmlinux.get(), "kfree_nolock", BTF_KIND_FUNC) >= 0;
  k.hash_elements = struct_has_member(vmlinux.get(), "bpf_htab", "pcpu_ma") || nolock_kmalloc;
  k.task_storage =
      struct_has_member(vmlinux.get(), "bpf_local_storage_map", "selem_ma") || nolock_kmalloc;
  // PREEMPT_RT's spinlock_t wraps an rt_mutex (`struct spinlock { struct rt_mutex_base
  // lock; }`); elsewhere it holds a raw spinlock in an unnamed union.
  k.sleeping_spinlocks = struct_has_member(vmlinux.get(), "spinlock", "lock");
  return k;
}

const KernelAllocators& kernel_allocators() {
  static std::mutex mutex;
  static std::map<std::string, KernelAllocators> cache;
  std::lock_guard lock(mutex);
  const std::string path = kernel_btf_path();
  auto it = cache.find(path);
  if (it == cache.end()) {
    it = cache.emplace(path, probe_kernel_allocators()).first;
    const KernelAllocators& k = it->second;
    spdlog::info("kernel allocators for BPF programs: hash map elements {}, task storage {}{}",
                 k.hash_elements ? "from the BPF memory allocator"
                                 : "from the page allocator (maps are preallocated)",
                 k.task_storage ? "from the BPF memory allocator"
                 : k.sleeping_spinlocks
                     ? "from the page allocator (not created on any hook)"
                     : "from the page allocator (not created on scheduler hooks)",
                 k.sleeping_spinlocks ? "; PREEMPT_RT (spinlocks sleep)" : "");
  }
  return it->second;
}

bool hook_holds_scheduler_locks(std::string_view section) {
  // The tracepoint is the last part of the section: tp_btf/sched_switch,
  // raw_tp/sched_switch, tracepoint/sched/sched_switch.
  static constexpr std::array<std::string_view, 7> kLocked = {
      "sched_switch",       "sched_wakeup",     "sched_wakeup_new",  "sched_waking",
      "sched_migrate_task", "sched_pi_setprio", "sched_stat_runtime"};
  const auto slash = section.rfind('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view hook = section.substr(slash + 1);
  for (std::string_view locked : kLocked) {
    if (hook == locked) return true;
  }
  // sched_stat_wait, _sleep, _iowait, _blocked: fired from the enqueue path, rq lock held.
  return hook.starts_with("sched_stat_");
}

std::vector<std::string> host_safety_refusals(bpf_object* obj, const KernelAllocators& kernel) {
  std::vector<std::string> refusals;
  bpf_program* prog;
  bpf_object__for_each_program(prog, obj) {
    if (!bpf_program__autoload(prog)) continue;
    const std::string which = std::string("program ") + bpf_program__name(prog) + " on " +
                              bpf_program__section_name(prog);
    const Calls calls = calls_of(prog);
    const bool gets_storage = std::any_of(calls.helpers.begin(), calls.helpers.end(),
                                          [](int h) { return one_of(kStorageGetHelpers, h); });
    if (!hook_holds_scheduler_locks(bpf_program__section_name(prog))) {
      // An iterator runs in process context, preemptible: kmalloc() may sleep there.
      const bool iterator = std::string_view(bpf_program__section_name(prog)).starts_with("iter");
      if (kernel.storage_in_tracepoints() || iterator) continue;
      if (gets_storage) {
        refusals.push_back(which +
                           " calls a local-storage get helper, which may create local storage "
                           "with preemption off, and on this PREEMPT_RT kernel local storage "
                           "allocates with kmalloc(), which takes sleeping locks (no BPF memory "
                           "allocator for it before Linux 6.4)");
      } else if (calls.out_of_sight) {
        refusals.push_back(which +
                           " calls a subprogram or hands a callback to a helper on this "
                           "PREEMPT_RT kernel, where local storage would allocate with kmalloc() "
                           "with preemption off, and what a subprogram calls cannot be checked "
                           "before load");
      }
      continue;
    }
    std::string refused;
    for (int h : calls.helpers) {
      if (!one_of(kSchedulerHelpers, h) && !one_of(kStorageGetHelpers, h))
        refused += (refused.empty() ? "helper " : ", helper ") + std::to_string(h);
    }
    if (!refused.empty()) {
      std::string reason = which;
      reason += " calls ";
      reason += refused;
      reason +=
          " (linux/bpf.h's enum bpf_func_id) under the scheduler's locks, where only helpers "
          "that neither allocate, sleep nor wake a task may run";
      refusals.push_back(std::move(reason));
      continue;
    }
    if (calls.out_of_sight) {
      refusals.push_back(which +
                         " calls a subprogram or hands a callback to a helper under the "
                         "scheduler's locks, whose helpers cannot be checked before load");
      continue;
    }
    if (kernel.task_storage || !gets_storage) continue;
    refusals.push_back(which +
                       " would create local storage under the scheduler's locks, and this "
                       "kernel's local storage allocates from the page allocator (no BPF "
                       "memory allocator for it before Linux 6.4)");
  }
  return refusals;
}

HostSafetyReport make_host_safe(bpf_object* obj, const KernelAllocators& kernel) {
  HostSafetyReport report;
  const std::vector<std::string> refusals = host_safety_refusals(obj, kernel);
  if (!refusals.empty()) {
    std::string all;
    for (const auto& r : refusals) all += (all.empty() ? "" : "; ") + r;
    throw BpfError(all);
  }
  bpf_map* map;
  bpf_object__for_each_map(map, obj) {
    if (kernel.hash_elements || !bpf_map__autocreate(map) || !is_hash(bpf_map__type(map))) continue;
    const __u32 flags = bpf_map__map_flags(map);
    if (!(flags & BPF_F_NO_PREALLOC)) continue;
    if (int err = bpf_map__set_map_flags(map, flags & ~static_cast<__u32>(BPF_F_NO_PREALLOC)))
      throw BpfError(bpf_error_text(std::string("preallocate map ") + bpf_map__name(map), err));
    report.preallocated_maps.emplace_back(bpf_map__name(map));
    report.preallocated_bytes += preallocated_size(map);
  }
  return report;
}

void make_host_safe(bpf_object* obj, const std::string& name) {
  const HostSafetyReport r = make_host_safe(obj, kernel_allocators());
  if (r.preallocated_maps.empty()) return;
  std::string maps;
  for (const auto& m : r.preallocated_maps) maps += (maps.empty() ? "" : ", ") + m;
  spdlog::info(
      "tracer {}: hash maps preallocated, {:.1f} MiB (this kernel's hash maps have no BPF "
      "memory allocator, so no element is allocated in a program): {}",
      name, static_cast<double>(r.preallocated_bytes) / (1 << 20), maps);
}

}  // namespace ebpf_metricsd
