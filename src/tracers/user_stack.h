#pragma once
// What the tracers that copy user stacks (bpf/common/ustack.bpf.h) set up before load.

#include <bpf/libbpf.h>

#include <cstdint>
#include <vector>

#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/profile/slow_options.h"

namespace ebpf_metricsd {

// Where the kernel saves a task's user registers from the task's kernel stack, measured once
// (bpf/ptregs_offset.bpf.c); 0 when it cannot be (the copies then need bpf_task_pt_regs,
// 5.15+, and count no_regs without it).
std::uint32_t user_regs_offset();

// Sets an object's user stack copies up: the offset above and the copies a second.
template <class Skeleton>
void configure_user_stacks(Skeleton* s, std::uint32_t per_second) {
  s->rodata->emd_ptregs_offset = user_regs_offset();
  s->rodata->emd_ustack_per_second = per_second;
}

// Threads at once inside a system call in which they started an event (a block request, a
// connect), and slow events held for their return, for bpf/common/slow_return.bpf.h; more are
// sent at once with the stack from their start (counted: slow_return_full).
inline constexpr std::uint32_t kSlowReturnCalls = 4096;
inline constexpr std::uint32_t kSlowReturnHeld = 1024;

// Sets up an object's slow events that are sent when their starter returns from the system
// call it waits in (bpf/common/slow_return.bpf.h), with `unwind: cfi`; its programs, to attach
// before those that start events.
template <class Skeleton>
std::vector<HookTwin> slow_return_hooks(Skeleton* s, const SlowOptions& slow) {
  const bool on = slow.on() && slow.unwind_cfi;
  s->rodata->emd_ptregs_offset = on ? user_regs_offset() : 0;
  bpf_map__set_max_entries(s->maps.emd_slow_calls, on ? kSlowReturnCalls : 1);
  bpf_map__set_max_entries(s->maps.emd_slow_held, on ? kSlowReturnHeld : 1);
  return {{s->progs.slow_sys_exit_btf, s->progs.slow_sys_exit_raw, on},
          {s->progs.slow_exit, s->progs.slow_exit, on},
          {s->progs.slow_exec, s->progs.slow_exec, on}};
}

}  // namespace ebpf_metricsd
