// SPDX-License-Identifier: GPL-2.0
/*
 * Off-CPU time: from a task switching out blocked to it switching in again
 * (common/offcpu.bpf.h); context switches, voluntary or involuntary, exactly
 * as the kernel counts nvcsw/nivcsw (voluntary = not preempted and not
 * runnable; the idle tasks' switches included, as in /proc/stat's ctxt); and
 * waits at or above the `slow` threshold, sent with the stacks where the task
 * blocked (common/slow.bpf.h), or, for a wait inside a system call with
 * `unwind: cfi`, held until the call returns and sent with a copy of the user
 * stack it returns to (common/slow_return.bpf.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/offcpu.bpf.h"
#include "common/read.bpf.h"
#include "common/slow_return.bpf.h"
#include "common/task_labels.bpf.h"
#include "offcpu_time.h"

/* emd_offcpu.flags: this wait is not sent, however long. */
#define WAIT_EXITING 1 /* the task was exiting: its user stack is gone */
#define WAIT_OWN 2     /* the daemon's own: not what anyone asks about */
/* With emd_slow_unwind_cfi: a wait inside a system call, whose user stack is
 * taken when the call returns (common/slow_return.bpf.h). */
#define WAIT_IN_CALL 4

EMD_DROPS_MAP(OFFCPU_DROP__COUNT);

EMD_TASK_HIST_MAPS(offcpu_hist);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OFFCPU_SWITCH__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} switches SEC(".maps");

/*
 * The slow capture, for prev (the current task), which blocks: the stacks of
 * where it waits (emd_offcpu_keep_stacks), taken at every blocking switch as
 * the user stack can only be taken now, slow or not; not for an exiting task
 * (its user stack is gone) nor the daemon's own. With emd_slow_unwind_cfi, a
 * user task inside a system call keeps only where the call returns to: its
 * user stack stays as it is until then, and a slow wait is held for the
 * call's return (send_slow_wait), to be sent with a copy of it.
 */
static __always_inline void keep_blocked_stacks(void *ctx, struct emd_offcpu *s,
						struct task_struct *prev,
						unsigned int prev_state,
						bool raw)
{
	__u32 flags = EMD_READ(raw, prev, flags);

	if (flags & PF_EXITING) {
		s->flags = WAIT_EXITING;
	} else if (EMD_READ(raw, prev, tgid) == emd_slow_self_tgid) {
		s->flags = WAIT_OWN;
	} else if (emd_slow_unwind_cfi && !(flags & PF_KTHREAD) &&
		   emd_syscall_site_here(&s->site, prev_state)) {
		s->flags = WAIT_IN_CALL;
		if (raw) /* no task pointer the helper takes at wake */
			s->kstack = emd_stack_take(ctx, 0, 0);
	} else {
		emd_offcpu_keep_stacks(ctx, s, prev, raw, 0, 1);
	}
}

/* next's wait of `waited` ns, counted in its histogram, is slow: send it. */
static __always_inline void send_slow_wait(struct task_struct *next,
					   struct emd_offcpu *s, __u64 now,
					   __u64 waited, bool raw)
{
	struct emd_slow_event *e;

	if (s->flags & WAIT_EXITING) {
		emd_count_drop(&drops, OFFCPU_DROP_SLOW_EXITING);
		return;
	}
	if (s->flags & WAIT_IN_CALL) {
		struct emd_slow_origin o = {};

		if (!emd_slow_admit(now, &drops, OFFCPU_DROP_SLOW_LIMITED))
			return;
		o.cgroup = EMD_READ(raw, next, cgroups, dfl_cgrp, kn, id);
		o.kstack = emd_offcpu_kstack(next, s, raw, 2);
		o.tgid = EMD_READ(raw, next, tgid);
		o.tid = EMD_READ(raw, next, pid);
		BPF_CORE_READ_STR_INTO(&o.comm, next, comm);
		o.site = s->site;
		/* The label text is the comm: the `comm` label of the series. */
		if (!emd_slow_hold_origin(&o, now, waited,
					  emd_seconds_slot(waited), 0, o.comm,
					  o.cgroup))
			/* no room, or a wait of the call held already: sent
			 * now, without the user stack it did not keep */
			emd_slow_send_origin(now, waited, emd_seconds_slot(waited),
					     0, o.comm, o.cgroup, &o, &drops,
					     OFFCPU_DROP_SLOW_RING_FULL);
		return;
	}
	e = emd_slow_reserve(now, &drops, OFFCPU_DROP_SLOW_LIMITED,
			     OFFCPU_DROP_SLOW_RING_FULL);
	if (!e)
		return;
	e->ts = now;
	e->latency_ns = waited;
	e->cgroup = EMD_READ(raw, next, cgroups, dfl_cgrp, kn, id);
	e->key = 0;
	e->tgid = EMD_READ(raw, next, tgid);
	e->tid = EMD_READ(raw, next, pid);
	e->slot = emd_seconds_slot(waited);
	e->taken = EMD_SLOW_TAKEN_AT_START;
	BPF_CORE_READ_STR_INTO(&e->comm, next, comm);
	/* The label text is the comm: the `comm` label of the series, if on. */
	__builtin_memcpy(e->label, e->comm, sizeof(e->comm));
	e->label[sizeof(e->comm)] = 0;
	e->kstack_len = emd_stack_copy(emd_offcpu_kstack(next, s, raw, 2),
				       e->kstack, EMD_SLOW_STACK_LOST);
	e->ustack_len =
	    emd_stack_copy(s->ustack, e->ustack, EMD_SLOW_STACK_LOST);
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int on_switch(void *ctx, bool preempt,
				     struct task_struct *prev,
				     struct task_struct *next,
				     unsigned int prev_state, bool raw)
{
	bool blocks = emd_offcpu_blocks(preempt, prev_state);
	__u32 kind =
	    blocks ? OFFCPU_SWITCH_VOLUNTARY : OFFCPU_SWITCH_INVOLUNTARY;
	struct emd_task_hist *h;
	struct emd_offcpu *s;
	__u64 *n, now, waited = 0;

	n = bpf_map_lookup_elem(&switches, &kind);
	if (n)
		*n += 1;
	now = bpf_ktime_get_ns();
	if (blocks) {
		s = emd_offcpu_block(prev, now, raw, &drops,
				     OFFCPU_DROP_TASK_STATE,
				     OFFCPU_DROP_WAKE_MISSED);
		if (s && emd_slow_threshold_ns)
			keep_blocked_stacks(ctx, s, prev, prev_state, raw);
	} else {
		emd_offcpu_runs(prev, raw, &drops, OFFCPU_DROP_WAKE_MISSED);
	}
	s = emd_offcpu_wake(next, now, &waited, raw, &drops,
			    OFFCPU_DROP_TASK_STATE);
	if (!s)
		return 0;
	h = emd_task_hist_of(next, &offcpu_hist, &offcpu_hist_labelled, &drops,
			     OFFCPU_DROP_MAP_FULL, raw);
	if (!h)
		return 0;
	emd_hist_add_ns(h, waited);
	if (!(s->flags & WAIT_OWN) &&
	    emd_slow(waited, EMD_READ(raw, next, tgid)))
		send_slow_wait(next, s, now, waited, raw);
	return 0;
}

#define SWITCH(preempt, prev, next, prev_state, raw)                           \
	on_switch(ctx, preempt, prev, next, prev_state, raw)

EMD_SCHED_SWITCH_PROGS(sched_switch, SWITCH)

EMD_SLOW_RETURN_PROGS(slow, &drops, OFFCPU_DROP_SLOW_RING_FULL)

char LICENSE[] SEC("license") = "GPL";
