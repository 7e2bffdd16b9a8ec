// SPDX-License-Identifier: GPL-2.0
/*
 * Scheduler tracers sharing one sched_switch hook:
 *  - run-queue latency: from a task becoming runnable (sched_wakeup,
 *    sched_wakeup_new, or preempted while still runnable at sched_switch) to it
 *    being switched in;
 *  - off-CPU time: from a task switching out blocked to it switching in again;
 *  - context switches, voluntary or involuntary, exactly as the kernel counts
 *    nvcsw/nivcsw (voluntary = not preempted and not runnable);
 *  - off-CPU waits at or above offcpu_time's `slow` threshold, sent with the
 *    stacks where the task blocked (common/slow.bpf.h).
 * Each hook exists as tp_btf (per-task state in task storage) and raw_tp
 * (per-task state in a pid hash, removed at sched_process_free), the raw_tp
 * kind also serving kernels whose tracing programs have no task storage.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/sched_switch.bpf.h"
#include "common/slow.bpf.h"
#include "scheduler.h"

struct sched_config sched_cfg = {};

static const struct sched_hist zero_hist = {};

struct task_sched {
	__u64 enqueued; /* ns when it became runnable, 0 = not waiting */
	__u64 blocked;  /* ns when it switched out blocked, 0 = not blocked */
	__u64 kstack;	/* slow capture: stacks where it blocked (slow_stacks) */
	__u64 ustack;
	__u32 not_slow; /* slow capture: this wait is not sent, however long */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_sched);
} tstate SEC(".maps");

/* raw_tp fallback only; user space sizes it (1 entry when tp_btf is used). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct task_sched);
} tstate_by_pid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sched_hist);
} runq_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sched_hist);
} offcpu_hist SEC(".maps");

/* Labelled variants: allocated on first use of a label set; user space sets
 * max_entries (label_map_entries) before load. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, SCHED_MAX_LABEL_SETS);
	__type(key, struct sched_key);
	__type(value, struct sched_hist);
} runq_hist_labelled SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, SCHED_MAX_LABEL_SETS);
	__type(key, struct sched_key);
	__type(value, struct sched_hist);
} offcpu_hist_labelled SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SCHED_SWITCH__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} switches SEC(".maps");

EMD_DROPS_MAP(SCHED_DROP__COUNT);

static __always_inline struct task_sched *task_state(struct task_struct *t,
						     bool create, bool raw)
{
	struct task_sched *s;
	__u32 pid;

	pid = EMD_READ(raw, t, pid);
	if (pid == 0) /* the idle tasks share pid 0 and never wait */
		return NULL;
	if (!raw) {
		s = bpf_task_storage_get(&tstate, t, 0,
					 create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
		if (!s && create)
			emd_count_drop(&drops, SCHED_DROP_TASK_STATE);
		return s;
	}
	if (!create)
		return bpf_map_lookup_elem(&tstate_by_pid, &pid);
	{
		static const struct task_sched zero = {};

		return emd_lookup_or_init(&tstate_by_pid, &pid, &zero, &drops,
					  SCHED_DROP_TASK_STATE);
	}
}

static __always_inline struct sched_hist *
hist_for(struct task_struct *t, void *plain, void *labelled, bool by_cgroup,
	 bool by_comm, __u32 drop_reason, bool raw)
{
	struct sched_key key = {};
	__u32 zero = 0;

	if (!by_cgroup && !by_comm)
		return bpf_map_lookup_elem(plain, &zero);
	if (by_cgroup) /* tp_btf: four plain loads, no helper calls */
		key.cgroup_id = EMD_READ(raw, t, cgroups, dfl_cgrp, kn, id);
	if (by_comm)
		BPF_CORE_READ_STR_INTO(&key.comm, t, comm);
	return emd_lookup_or_init(labelled, &key, &zero_hist, &drops,
				  drop_reason);
}

static __always_inline int on_wakeup(struct task_struct *p, bool raw)
{
	struct task_sched *s;

	if (!sched_cfg.runq_on)
		return 0;
	s = task_state(p, true, raw);
	if (s)
		s->enqueued = bpf_ktime_get_ns();
	return 0;
}

/*
 * offcpu_time's slow capture, for prev (the current task), which blocks: the
 * stacks of where it waits. Its user stack can only be taken now, while it is
 * current, so it is taken at every blocking switch. Its kernel stack stays as
 * it is until it runs again: with a BTF task pointer (tp_btf) it is taken then,
 * and only for a slow wait; raw_tp has no task pointer the helper accepts, so
 * it takes it now too.
 */
static __always_inline void keep_blocked_stacks(void *ctx,
						struct task_sched *s,
						struct task_struct *prev,
						bool raw)
{
	__u32 flags = EMD_READ(raw, prev, flags);

	s->kstack = 0;
	s->ustack = 0;
	/* Not the waits of an exiting task (its user stack is gone) or of the
	 * daemon itself (not what anyone asks about). */
	s->not_slow = (flags & PF_EXITING) ||
		      EMD_READ(raw, prev, tgid) == emd_slow_self_tgid;
	if (s->not_slow)
		return;
	if (raw)
		s->kstack = emd_slow_keep_stack(ctx, 0, 0);
	if (!(flags & PF_KTHREAD))
		s->ustack = emd_slow_keep_stack(ctx, 1, BPF_F_USER_STACK);
}

/* next's wait of `waited` ns, counted in its histogram, is slow: send it. */
static __always_inline void send_slow_wait(struct task_struct *next,
					   struct task_sched *s, __u64 now,
					   __u64 waited, bool raw)
{
	struct emd_slow_event *e;

	e = emd_slow_reserve(now, &drops, SCHED_DROP_SLOW_LIMITED,
			     SCHED_DROP_SLOW_RING_FULL);
	if (!e)
		return;
	e->ts = now;
	e->latency_ns = waited;
	e->cgroup = EMD_READ(raw, next, cgroups, dfl_cgrp, kn, id);
	e->key = 0;
	e->tgid = EMD_READ(raw, next, tgid);
	e->tid = EMD_READ(raw, next, pid);
	e->slot = emd_seconds_slot(waited);
	e->pad = 0;
	BPF_CORE_READ_STR_INTO(&e->comm, next, comm);
	/* The label text is the comm: the `comm` label of the series, if on. */
	__builtin_memcpy(e->label, e->comm, sizeof(e->comm));
	e->label[sizeof(e->comm)] = 0;
	e->kstack_len = raw ? emd_slow_copy_stack(s->kstack, e->kstack) :
			      bpf_get_task_stack(next, e->kstack,
						 sizeof(e->kstack), 0);
	e->ustack_len = emd_slow_copy_stack(s->ustack, e->ustack);
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int on_switch(void *ctx, bool preempt,
				     struct task_struct *prev,
				     struct task_struct *next,
				     unsigned int prev_state, bool raw)
{
	bool runnable = preempt || prev_state == TASK_RUNNING;
	__u32 kind = runnable ? SCHED_SWITCH_INVOLUNTARY :
				SCHED_SWITCH_VOLUNTARY;
	struct sched_hist *h;
	struct task_sched *s;
	__u64 *n, now;

	if (!sched_cfg.offcpu_on && !sched_cfg.runq_on)
		return 0;
	if (sched_cfg.offcpu_on) { /* the switch counts are offcpu_time's */
		n = bpf_map_lookup_elem(&switches, &kind);
		if (n)
			*n += 1;
	}
	now = bpf_ktime_get_ns();

	/*
	 * prev: still on the run queue (preempted), or going to sleep. Both
	 * stamps were cleared when it was switched in, so there is nothing to
	 * do for it unless one of them is being set now.
	 */
	if (runnable ? sched_cfg.runq_on : sched_cfg.offcpu_on) {
		s = task_state(prev, true, raw);
		if (s) {
			if (runnable) {
				s->enqueued = now;
			} else {
				s->blocked = now;
				if (emd_slow_threshold_ns)
					keep_blocked_stacks(ctx, s, prev, raw);
			}
		}
	}

	/*
	 * next: its wait ends now. Looked up with create, like prev above: the
	 * storage exists for every task that was switched out before, and a
	 * failure (task storage busy or out of memory) is counted, never lost.
	 */
	s = task_state(next, true, raw);
	if (!s)
		return 0;
	if (s->enqueued && sched_cfg.runq_on) {
		h = hist_for(next, &runq_hist, &runq_hist_labelled,
			     sched_cfg.runq_by_cgroup, sched_cfg.runq_by_comm,
			     SCHED_DROP_RUNQ_LABELS, raw);
		if (h)
			emd_hist_add_ns(h, now - s->enqueued);
	}
	s->enqueued = 0;
	if (s->blocked && sched_cfg.offcpu_on) {
		h = hist_for(next, &offcpu_hist, &offcpu_hist_labelled,
			     sched_cfg.offcpu_by_cgroup, sched_cfg.offcpu_by_comm,
			     SCHED_DROP_OFFCPU_LABELS, raw);
		if (h) {
			__u64 waited = now - s->blocked;

			emd_hist_add_ns(h, waited);
			if (!s->not_slow &&
			    emd_slow(waited, EMD_READ(raw, next, tgid)))
				send_slow_wait(next, s, now, waited, raw);
		}
	}
	s->blocked = 0;
	return 0;
}

#define WAKEUP(raw) on_wakeup(p, raw)

EMD_TP_PROGS(sched_wakeup, sched_wakeup, WAKEUP, struct task_struct *p)
EMD_TP_PROGS(sched_wakeup_new, sched_wakeup_new, WAKEUP, struct task_struct *p)
#define SWITCH(preempt, prev, next, prev_state, raw)                          \
	on_switch(ctx, preempt, prev, next, prev_state, raw)

EMD_SCHED_SWITCH_PROGS(sched_switch, SWITCH)

/* raw_tp keeps per-task state in a pid map: drop it with the task. */
SEC("raw_tp/sched_process_free")
int BPF_PROG(sched_free_raw, struct task_struct *p)
{
	__u32 pid = BPF_CORE_READ(p, pid);

	bpf_map_delete_elem(&tstate_by_pid, &pid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
