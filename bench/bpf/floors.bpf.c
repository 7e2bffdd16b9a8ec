// SPDX-License-Identifier: GPL-2.0
/*
 * The overhead floor of every tracer: empty programs on the same hooks. The
 * benchmark attaches the subset a tracer uses.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("tp_btf/sys_enter")
int BPF_PROG(floor_sys_enter)
{
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(floor_sys_exit)
{
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(floor_wakeup)
{
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(floor_wakeup_new)
{
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_switch)
{
	return 0;
}

SEC("perf_event")
int floor_fault(struct bpf_perf_event_data *ctx)
{
	return 0;
}

SEC("tp_btf/kmalloc")
int BPF_PROG(floor_kmalloc)
{
	return 0;
}

SEC("tp_btf/kfree")
int BPF_PROG(floor_kfree)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
