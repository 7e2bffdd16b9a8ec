/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The off-CPU state machine, for every object that measures time blocked
 * (offcpu_time, the profile): at sched_switch a thread that switches out
 * neither preempted nor runnable blocks, and its wait ends when it is switched
 * in again. Its state (common/task_state.bpf.h) holds when it blocked and what
 * the includer keeps with the wait (the stacks where it blocked). Each object
 * that includes it keeps its own state: two such tracers cost two programs on
 * sched_switch and two states per thread.
 */
#ifndef EBPF_METRICSD_OFFCPU_BPF_H
#define EBPF_METRICSD_OFFCPU_BPF_H

#include "common/sched_switch.bpf.h"
#include "common/task_state.bpf.h"

struct emd_offcpu {
	__u64 blocked; /* ns when it switched out blocked; 0: not blocked */
	__u64 kstack;  /* the includer's: stack hashes where it blocked */
	__u64 ustack;
	__u32 flags;   /* the includer's */
	__u32 pad;
};

EMD_TASK_STATE(emd_offcpu, struct emd_offcpu)

/* Whether the task switched out now blocks (not preempted, not runnable). */
static __always_inline bool emd_offcpu_blocks(bool preempt,
					      unsigned int prev_state)
{
	return !preempt && prev_state != TASK_RUNNING;
}

/*
 * prev blocks at `now`: its state, stamped and cleared for the includer to
 * fill, or NULL (an idle task, or no room: counted under `reason`).
 */
static __always_inline struct emd_offcpu *
emd_offcpu_block(struct task_struct *prev, __u64 now, bool raw, void *drops,
		 __u32 reason)
{
	struct emd_offcpu *s = emd_offcpu_of(prev, true, raw, drops, reason);

	if (s) {
		s->blocked = now;
		s->kstack = 0;
		s->ustack = 0;
		s->flags = 0;
	}
	return s;
}

/*
 * next is switched in at `now`: when it was blocked, its state (the stamp
 * cleared) and in *waited the wait; else NULL. `create`: make the state if it
 * is missing, so that a thread whose state could not be kept is counted here
 * too, not passed unseen.
 */
static __always_inline struct emd_offcpu *
emd_offcpu_wake(struct task_struct *next, __u64 now, __u64 *waited, bool raw,
		bool create, void *drops, __u32 reason)
{
	struct emd_offcpu *s = emd_offcpu_of(next, create, raw, drops, reason);

	if (!s || !s->blocked)
		return NULL;
	*waited = now - s->blocked;
	s->blocked = 0;
	return s;
}

#endif
