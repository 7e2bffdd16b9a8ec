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

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(floor_inet_sock_set_state)
{
	return 0;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(floor_net_dev_queue)
{
	return 0;
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(floor_net_dev_xmit)
{
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(floor_block_rq_issue)
{
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(floor_block_rq_complete)
{
	return 0;
}

SEC("tp_btf/mm_filemap_get_pages")
int BPF_PROG(floor_get_pages)
{
	return 0;
}

SEC("tp_btf/mm_filemap_map_pages")
int BPF_PROG(floor_map_pages)
{
	return 0;
}

SEC("tp_btf/mm_filemap_fault")
int BPF_PROG(floor_filemap_fault)
{
	return 0;
}

SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(floor_add_to_page_cache)
{
	return 0;
}

SEC("tp_btf/writeback_dirty_folio")
int BPF_PROG(floor_dirty_folio)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
