#pragma once
// The host-safety rule (docs/host-safety.md), applied to every BPF object between open and
// load: no program may allocate memory where the allocation can deadlock the kernel.
//
// A tracing program runs wherever its hook fires, with whatever locks the kernel holds
// there. Before Linux 6.1 a hash map created with BPF_F_NO_PREALLOC takes its elements from
// kmalloc and, per CPU, from the percpu allocator, which may queue work and so wake a
// kworker: from a program on sched_switch (the CPU's run-queue lock held) that wakeup spins
// on the lock its own CPU holds, with interrupts off, and the host stops without a word
// (seen on Debian's 5.10; the 5.10 verifier warns "trace type programs with run-time
// allocated hash maps are unsafe"). Since 6.1 hash maps allocate from the BPF memory
// allocator (per-CPU caches refilled from irq_work), safe in any context. Task storage
// allocates with kmalloc(GFP_ATOMIC), which may wake kswapd, until it too moved to the BPF
// memory allocator (6.4), and later to kmalloc_nolock() (7.x), which is safe anywhere. On a
// PREEMPT_RT kernel kmalloc() takes sleeping locks, and a tracepoint's programs run with
// preemption off: there such local storage is made on no hook (seen on Debian's 6.1-rt:
// "BUG: scheduling while atomic" from a task's first system call after the attach).
//
// Whether the kernel has those allocators is read from its BTF (the fields that hold them),
// never from its version number.

#include <bpf/libbpf.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

// Which run-time allocations a tracing program may make on this kernel.
struct KernelAllocators {
  // Hash map elements (per-CPU ones too) come from the BPF memory allocator
  // (struct bpf_htab has a pcpu_ma: 6.1+) or kmalloc_nolock() exists.
  bool hash_elements = false;
  // Task storage elements come from the BPF memory allocator (struct
  // bpf_local_storage_map has a selem_ma: 6.4+) or from kmalloc_nolock() (the kernel has
  // its kfree_nolock(): 6.18+; local storage moved to it in 7.x).
  bool task_storage = false;
  // A PREEMPT_RT kernel: spinlock_t is a sleeping lock (struct spinlock holds an rt_mutex),
  // so kmalloc() may sleep, and must not be called where preemption is off: in any
  // tracepoint's program. There local storage that allocates with kmalloc cannot be created
  // on any hook.
  bool sleeping_spinlocks = false;

  // Whether a tracepoint's program (preemption off) may create local storage: not on
  // PREEMPT_RT where local storage allocates with kmalloc().
  bool storage_in_tracepoints() const { return task_storage || !sleeping_spinlocks; }
};

// From the kernel's BTF (kernel_btf_path() when set); both false without BTF.
KernelAllocators probe_kernel_allocators();
// The same, probed once per BTF path and kept.
const KernelAllocators& kernel_allocators();

// Hooks whose tracepoint fires with a run-queue lock or a task's pi_lock held (the
// scheduler's own): a wakeup from a program there deadlocks.
bool hook_holds_scheduler_locks(std::string_view section);

struct HostSafetyReport {
  // Hash maps whose elements are preallocated at load in place of on first use, and the
  // memory that costs (all possible CPUs' values for per-CPU maps).
  std::vector<std::string> preallocated_maps;
  std::size_t preallocated_bytes = 0;
};

// The autoloaded programs of an opened object that the rule refuses on this kernel, each
// with its reason.
std::vector<std::string> host_safety_refusals(bpf_object* obj, const KernelAllocators& kernel);

// Applies the rule to an opened, not yet loaded object, given what the kernel allows:
//  - every hash map created with BPF_F_NO_PREALLOC is preallocated where the kernel's hash
//    maps have no BPF memory allocator;
//  - an autoloaded program on a scheduler hook that calls a local-storage get helper, or a
//    subprogram (whose instructions libbpf shows only at load), is refused (BpfError with
//    the reason) where local storage has no allocator that is safe there; on a PREEMPT_RT
//    kernel, so is a program on any hook that calls a local-storage get helper.
// Map sizes must be set before: preallocation is sized from max_entries.
HostSafetyReport make_host_safe(bpf_object* obj, const KernelAllocators& kernel);

// make_host_safe with kernel_allocators(), logging what was preallocated, for `name`.
void make_host_safe(bpf_object* obj, const std::string& name);

}  // namespace ebpf_metricsd
