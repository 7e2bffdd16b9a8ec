// SPDX-License-Identifier: GPL-2.0
/*
 * An independent count of one thread's returns from blocking: switch-ins of
 * target_tid that follow a switch-out in which it was not runnable.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

volatile int target_tid = 0;
__u64 returns_from_blocking = 0;
static bool blocked_out = false;

static __always_inline void on_switch(int prev_pid, int next_pid, bool blocked)
{
	int tid = target_tid;

	if (tid == 0)
		return;
	if (prev_pid == tid)
		blocked_out = blocked;
	if (next_pid == tid && blocked_out) {
		blocked_out = false;
		__sync_fetch_and_add(&returns_from_blocking, 1);
	}
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

	on_switch(prev->pid, next->pid, !preempt && state != 0);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(oracle_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	on_switch(prev->pid, next->pid, !preempt && prev_state != 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
