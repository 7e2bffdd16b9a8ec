// SPDX-License-Identifier: GPL-2.0
/*
 * An independent count of one thread's returns from blocking: switch-ins of
 * target_tid that follow a switch-out in which it was not runnable.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

volatile int target_tid = 0;
__u64 returns_from_blocking = 0;
static bool blocked_out = false;

SEC("tp_btf/sched_switch")
int BPF_PROG(oracle_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	int tid = target_tid;

	if (tid == 0)
		return 0;
	if (prev->pid == tid)
		blocked_out = !preempt && prev_state != 0;
	if (next->pid == tid && blocked_out) {
		blocked_out = false;
		__sync_fetch_and_add(&returns_from_blocking, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
