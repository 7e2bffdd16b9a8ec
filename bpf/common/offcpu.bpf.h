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
#include "common/stacks.bpf.h"
#include "common/task_state.bpf.h"
#include "common/ustack.bpf.h"

#ifndef PF_KTHREAD
#define PF_KTHREAD 0x00200000
#endif

/* Long waits inside the system call the thread is in, whose user stack is
 * taken when the call returns (emd_syscall_wait_*). */
struct emd_syscall_wait {
	struct emd_syscall_site site;
	__u64 ns;     /* time blocked, in all */
	__u64 kstack; /* where it blocked (the first of the waits) */
	__u64 began;  /* when the first of the waits began */
	__u64 ended;  /* and the last ended */
	__u32 waits;  /* 0: none pending */
	__u32 pad;
};

struct emd_offcpu {
	__u64 blocked; /* ns when it switched out blocked; 0: not blocked */
	__u64 kstack;  /* the includer's: stack hashes where it blocked */
	__u64 ustack;
	__u32 flags; /* the includer's */
	__u32 pad;
	struct emd_syscall_site site; /* of this wait (nr -1: none) */
	struct emd_syscall_wait pending;
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
 * fill, or NULL (an idle task, or no room: counted under `reason`). A stamp
 * still there is a wait whose end was not seen: the program at the switch that
 * ended it found no state (the kernel refuses task storage to a program while
 * another user of it on the CPU holds it, as a task that exits does), or no
 * program ran there at all (observed on virtual machines whose kernel runs no
 * BPF program in the context of the guest init's threads: a switch out of one
 * of them is seen by none, whichever task it hands the CPU to). Counted under
 * `missed`.
 */
static __always_inline struct emd_offcpu *
emd_offcpu_block(struct task_struct *prev, __u64 now, bool raw, void *drops,
		 __u32 reason, __u32 missed)
{
	struct emd_offcpu *s = emd_offcpu_of(prev, true, raw, drops, reason);

	if (s) {
		if (s->blocked)
			emd_count_drop(drops, missed);
		s->blocked = now;
		s->kstack = 0;
		s->ustack = 0;
		s->flags = 0;
		s->site.nr = -1;
	}
	return s;
}

/*
 * prev switches out without a new wait being stamped (preempted, or a block
 * the includer does not time): it ran, so a stamp still there is a wait whose
 * end was not seen (see emd_offcpu_block): counted under `missed` and cleared,
 * so that its next switch-in does not end that wait and take the time it ran
 * for time blocked.
 */
static __always_inline void emd_offcpu_runs(struct task_struct *prev, bool raw,
					    void *drops, __u32 missed)
{
	struct emd_offcpu *s = emd_offcpu_of(prev, false, raw, drops, 0);

	if (s && s->blocked) {
		emd_count_drop(drops, missed);
		s->blocked = 0;
	}
}

/*
 * next is switched in at `now`: when it was blocked, its state (the stamp
 * cleared) and in *waited the wait; else NULL. Only looked up: a thread whose
 * state could not be made when it blocked was counted then.
 */
static __always_inline struct emd_offcpu *
emd_offcpu_wake(struct task_struct *next, __u64 now, __u64 *waited, bool raw,
		void *drops, __u32 reason)
{
	struct emd_offcpu *s = emd_offcpu_of(next, false, raw, drops, reason);

	if (!s || !s->blocked)
		return NULL;
	*waited = now - s->blocked;
	s->blocked = 0;
	return s;
}

/*
 * prev blocks: keeps in s the stacks of where it waits. Its user stack (unless
 * a kernel thread) can only be taken now, while it is current. Its kernel
 * stack stays as it is until it runs again, so it is taken at wake
 * (emd_offcpu_kstack), except with raw_tp, whose task pointers
 * bpf_get_task_stack does not take: then now. kslot, uslot: scratch slots.
 */
static __always_inline void emd_offcpu_keep_stacks(void *ctx,
						   struct emd_offcpu *s,
						   struct task_struct *prev,
						   bool raw, __u32 kslot,
						   __u32 uslot)
{
	if (raw)
		s->kstack = emd_stack_take(ctx, kslot, 0);
	if (!(EMD_READ(raw, prev, flags) & PF_KTHREAD))
		s->ustack = emd_stack_take(ctx, uslot, BPF_F_USER_STACK);
}

/* next wakes from the wait in s: the hash of the kernel stack it waited in,
 * taken now where it still is (tp_btf) or kept when it blocked (raw_tp). */
static __always_inline __u64 emd_offcpu_kstack(struct task_struct *next,
					       struct emd_offcpu *s, bool raw,
					       __u32 kslot)
{
	return raw ? s->kstack : emd_stack_take_task(next, kslot);
}

/* Why a wait inside a system call lost its user stack (the includer counts
 * it and keeps the wait with its kernel stack only). */
enum emd_syscall_wait_loss {
	EMD_SYSCALL_WAIT_KEPT = 0,
	EMD_SYSCALL_WAIT_MISMATCH, /* it returned elsewhere than it blocked */
	EMD_SYSCALL_WAIT_EXEC,	   /* the call was an execve that succeeded */
	EMD_SYSCALL_WAIT_EXITED,   /* the thread exited inside the call */
	EMD_SYSCALL_WAIT_KSTACK,   /* a later wait of the call had another
				      kernel stack */
};

/*
 * A wait of `waited` ns at `kstack` in the system call at s->site ended at
 * `now`: kept pending for the call's return. A pending wait of another call
 * (its return was missed) or of another kernel stack is handed back in
 * *flush, with why (enum emd_syscall_wait_loss), for the includer to keep
 * without a user stack.
 */
static __always_inline __u32
emd_syscall_wait_add(struct emd_offcpu *s, __u64 now, __u64 waited,
		     __u64 kstack, struct emd_syscall_wait *flush)
{
	__u32 loss = EMD_SYSCALL_WAIT_KEPT;

	if (s->pending.waits) {
		if (!emd_syscall_site_is(&s->pending.site, s->site.ip,
					 s->site.sp, s->site.nr))
			loss = EMD_SYSCALL_WAIT_MISMATCH;
		else if (s->pending.kstack != kstack)
			loss = EMD_SYSCALL_WAIT_KSTACK;
		if (loss == EMD_SYSCALL_WAIT_KEPT) {
			s->pending.waits++;
			s->pending.ns += waited;
			s->pending.ended = now;
			return loss;
		}
		*flush = s->pending;
	}
	s->pending.site = s->site;
	s->pending.ns = waited;
	s->pending.kstack = kstack;
	s->pending.began = now - waited;
	s->pending.ended = now;
	s->pending.waits = 1;
	return loss;
}

/*
 * The current task returns from a system call with user registers r: takes
 * its pending waits into *w (false: none), with whether they keep the user
 * stack it returns to (EMD_SYSCALL_WAIT_KEPT) or why not.
 */
static __always_inline bool emd_syscall_wait_take(struct emd_offcpu *s,
						  const struct emd_user_regs *r,
						  struct emd_syscall_wait *w,
						  __u32 *loss)
{
	if (!s || !s->pending.waits)
		return false;
	*w = s->pending;
	s->pending.waits = 0;
	if (emd_syscall_site_is(&w->site, r->ip, r->sp, (__s64)r->orig_ax))
		*loss = EMD_SYSCALL_WAIT_KEPT;
	else if (w->site.nr == 59 || w->site.nr == 322) /* execve, execveat */
		*loss = EMD_SYSCALL_WAIT_EXEC;
	else
		*loss = EMD_SYSCALL_WAIT_MISMATCH;
	return true;
}

#endif
