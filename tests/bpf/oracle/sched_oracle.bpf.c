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
 * One task of the target at a time: the state is kept once, not per task (and
 * cleared by user space with a new target: a task's last switch-out, at its exit,
 * leaves it set).
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
__u64 blocked_at = 0;
bool blocked_out = false;
bool queued = false;

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
	if (is_target(prev)) {
		if (blocked_out) {
			__sync_fetch_and_add(&unseen_returns, 1);
			blocked_out = false;
		}
		if (prev_state_dead)
			__sync_fetch_and_add(&dead_switch_outs, 1);
		if (blocked) {
			blocked_out = true;
			blocked_at = bpf_ktime_get_ns();
			__sync_fetch_and_add(&blocked_switch_outs, 1);
		} else {
			queued = true;
		}
	}
	if (is_target(next)) {
		if (blocked_out) {
			__sync_fetch_and_add(&returns_from_blocking, 1);
			__sync_fetch_and_add(&blocked_ns,
					     bpf_ktime_get_ns() - blocked_at);
		}
		if (queued)
			__sync_fetch_and_add(&returns_from_queue, 1);
		blocked_out = false;
		queued = false;
	}
}

static __always_inline void on_wakeup(struct task_struct *p)
{
	if (is_target(p))
		queued = true;
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
