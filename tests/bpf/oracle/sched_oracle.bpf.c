// SPDX-License-Identifier: GPL-2.0
/*
 * An independent count of the returns to a CPU of one target: a thread
 * (target_tid), the tasks of a cgroup v2 (target_cgroup, its id) or the tasks
 * named target_comm.
 *  - returns_from_blocking: switch-ins that follow a switch-out in which the
 *    task was not runnable;
 *  - returns_from_queue: switch-ins that follow a wakeup, the wakeup of a new
 *    task, or a switch-out in which it stayed runnable;
 *  - blocked_switch_outs: switch-outs in which the task was not runnable (a test
 *    waits on it to know that its workload really blocked);
 *  - blocked_ns: the time from each such switch-out to the switch-in after it;
 *  - unseen_returns: switch-outs that followed a blocked switch-out with no
 *    switch-in seen between: the task ran again, but no program ran at the
 *    switch that returned it to a CPU (observed on virtual machines whose
 *    kernel runs no BPF program in the context of the guest init's threads: a
 *    switch out of one of them is seen by none, whichever task it hands the CPU
 *    to);
 *  - dead_switch_outs: last switch-outs of exiting tasks (after wait4() or
 *    pthread_join() returned, so a test waits for it before it reads the
 *    counts: that switch-out is where a last unseen return is found).
 * unseen_by_tid holds unseen_returns by thread. The state of each task of the
 * target is kept in task_states, by thread id, until its last switch-out; a new
 * target starts a new generation, in which the states of the one before count
 * as unset. untracked: the times a task of the target could not be followed
 * (a map full), which the tests require to be none.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#ifndef TASK_DEAD
#define TASK_DEAD 0x80
#endif

volatile int target_tid = 0;
volatile __u64 target_cgroup = 0;
char target_comm[16] = {};
__u64 returns_from_blocking = 0;
__u64 returns_from_queue = 0;
__u64 blocked_switch_outs = 0;
__u64 blocked_ns = 0;
__u64 unseen_returns = 0;
__u64 dead_switch_outs = 0;
__u64 untracked = 0;
volatile __u32 generation = 0;

struct task_state {
	__u64 blocked_at;
	__u32 generation;
	bool blocked_out;
	bool queued;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct task_state);
} task_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} unseen_by_tid SEC(".maps");

/* The state of task `tid` in this generation, created unset where there is none. */
static __always_inline struct task_state *state_of(__u32 tid)
{
	struct task_state *st = bpf_map_lookup_elem(&task_states, &tid);
	__u32 gen = generation;

	if (!st) {
		struct task_state fresh = { .generation = gen };

		bpf_map_update_elem(&task_states, &tid, &fresh, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&task_states, &tid);
		if (!st)
			__sync_fetch_and_add(&untracked, 1);
		return st;
	}
	if (st->generation != gen) {
		st->generation = gen;
		st->blocked_out = false;
		st->queued = false;
	}
	return st;
}

static __always_inline void count_unseen(__u32 tid)
{
	__u64 one = 1, *n = bpf_map_lookup_elem(&unseen_by_tid, &tid);

	__sync_fetch_and_add(&unseen_returns, 1);
	if (n)
		__sync_fetch_and_add(n, 1);
	else if (bpf_map_update_elem(&unseen_by_tid, &tid, &one, BPF_NOEXIST))
		__sync_fetch_and_add(&untracked, 1);
}

static __always_inline bool is_target(struct task_struct *t)
{
	int tid = target_tid;
	__u64 cgroup = target_cgroup;

	if (tid)
		return BPF_CORE_READ(t, pid) == tid;
	if (cgroup)
		return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id) == cgroup;
	if (target_comm[0]) {
		char comm[16];

		BPF_CORE_READ_INTO(&comm, t, comm);
		for (int i = 0; i < 16; i++) {
			if (comm[i] != target_comm[i])
				return false;
			if (!comm[i])
				break;
		}
		return true;
	}
	return false;
}

static __always_inline void on_switch(struct task_struct *prev,
				      struct task_struct *next, bool blocked,
				      bool prev_state_dead)
{
	struct task_state *st;

	if (is_target(prev)) {
		__u32 tid = BPF_CORE_READ(prev, pid);

		st = state_of(tid);
		if (st && st->blocked_out) {
			count_unseen(tid);
			st->blocked_out = false;
		}
		if (blocked)
			__sync_fetch_and_add(&blocked_switch_outs, 1);
		if (prev_state_dead) {
			/* it runs no more: its state goes */
			__sync_fetch_and_add(&dead_switch_outs, 1);
			bpf_map_delete_elem(&task_states, &tid);
		} else if (st && blocked) {
			st->blocked_out = true;
			st->blocked_at = bpf_ktime_get_ns();
		} else if (st) {
			st->queued = true;
		}
	}
	if (is_target(next)) {
		st = state_of(BPF_CORE_READ(next, pid));
		if (!st)
			return;
		if (st->blocked_out) {
			__sync_fetch_and_add(&returns_from_blocking, 1);
			__sync_fetch_and_add(&blocked_ns,
					     bpf_ktime_get_ns() - st->blocked_at);
		}
		if (st->queued)
			__sync_fetch_and_add(&returns_from_queue, 1);
		st->blocked_out = false;
		st->queued = false;
	}
}

static __always_inline void on_wakeup(struct task_struct *p)
{
	struct task_state *st;

	if (!is_target(p))
		return;
	st = state_of(BPF_CORE_READ(p, pid));
	if (st)
		st->queued = true;
}

struct task_struct___long_state {
	volatile long state;
} __attribute__((preserve_access_index));

/* Kernels before 5.18 pass no prev_state: the test loads this one there. */
SEC("tp_btf/sched_switch")
int BPF_PROG(oracle_switch_3arg, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	long state = bpf_core_field_exists(prev->__state) ?
			     (long)BPF_CORE_READ(prev, __state) :
			     BPF_CORE_READ((struct task_struct___long_state *)prev,
					   state);

	on_switch(prev, next, !preempt && state != 0, state & TASK_DEAD);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(oracle_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	on_switch(prev, next, !preempt && prev_state != 0,
		  prev_state & TASK_DEAD);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(oracle_wakeup, struct task_struct *p)
{
	on_wakeup(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(oracle_wakeup_new, struct task_struct *p)
{
	on_wakeup(p);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
