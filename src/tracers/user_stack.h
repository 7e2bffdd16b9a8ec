#pragma once
// What the tracers that copy user stacks (bpf/common/ustack.bpf.h) set up before load.

#include <bpf/libbpf.h>

#include <cstdint>

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

}  // namespace ebpf_metricsd
