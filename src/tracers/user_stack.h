#pragma once
// What the tracers whose BPF side reads user registers (bpf/common/ustack.bpf.h) and walks user
// stacks (bpf/common/unwind.bpf.h) set up before load.

#include <bpf/libbpf.h>

#include <cstdint>
#include <vector>

#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/profile/slow_options.h"

namespace ebpf_metricsd {

// Where the kernel saves a task's user registers from the task's kernel stack, measured once
// (bpf/ptregs_offset.bpf.c); 0 when it cannot be (the walks from them then need
// bpf_task_pt_regs, 5.15+, and end as no_user without it).
std::uint32_t user_regs_offset();

// Threads at once inside a system call in which they started an event (a block request, a
// connect), and slow events held for their return, for bpf/common/slow_return.bpf.h; more are
// sent at once with the stack from their start (counted: slow_return_full).
inline constexpr std::uint32_t kSlowReturnCalls = 4096;
inline constexpr std::uint32_t kSlowReturnHeld = 1024;

// The walk's programs of an object's slow events (bpf/common/slow_walk.bpf.h), with `unwind:
// cfi`: the walkers, never attached (its sys_exit programs tail-call them), and the program
// that tells the daemon of exits.
template <class Skeleton>
std::vector<HookTwin> slow_walker_hooks(Skeleton* s, const SlowOptions& slow) {
  const bool on = slow.on() && slow.unwind_cfi;
  return {{s->progs.emd_slow_walk_btf, s->progs.emd_slow_walk_raw, on, /*attach=*/false},
          {s->progs.emd_slow_walk_exit, s->progs.emd_slow_walk_exit, on}};
}

// Sets up an object's slow events that are sent when their starter returns from the system
// call it waits in (bpf/common/slow_return.bpf.h), with `unwind: cfi`; its programs, to attach
// before those that start events.
template <class Skeleton>
std::vector<HookTwin> slow_return_hooks(Skeleton* s, const SlowOptions& slow) {
  const bool on = slow.on() && slow.unwind_cfi;
  s->rodata->emd_ptregs_offset = on ? user_regs_offset() : 0;
  bpf_map__set_max_entries(s->maps.emd_slow_calls, on ? kSlowReturnCalls : 1);
  bpf_map__set_max_entries(s->maps.emd_slow_held, on ? kSlowReturnHeld : 1);
  std::vector<HookTwin> hooks = {{s->progs.slow_sys_exit_btf, s->progs.slow_sys_exit_raw, on},
                                 {s->progs.slow_exit, s->progs.slow_exit, on},
                                 {s->progs.slow_exec, s->progs.slow_exec, on}};
  for (const HookTwin& t : slow_walker_hooks(s, slow)) hooks.push_back(t);
  return hooks;
}

}  // namespace ebpf_metricsd
