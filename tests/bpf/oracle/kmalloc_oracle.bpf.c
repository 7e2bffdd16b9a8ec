// SPDX-License-Identifier: GPL-2.0
/* An independent count of the kmalloc and kfree tracepoints, for the tests. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

__u64 kmallocs = 0;
__u64 kfrees = 0;
__u64 requested = 0;
__u64 cache_calls = 0;

static __always_inline int count_kmalloc(size_t bytes_req)
{
	__sync_fetch_and_add(&kmallocs, 1);
	__sync_fetch_and_add(&requested, bytes_req);
	return 0;
}

SEC("tp_btf/kmalloc")
int BPF_PROG(oracle_kmalloc, unsigned long call_site, const void *ptr,
	     size_t bytes_req)
{
	return count_kmalloc(bytes_req);
}

/* Loaded where the kernel has it (before 6.1). */
SEC("tp_btf/kmalloc_node")
int BPF_PROG(oracle_kmalloc_node, unsigned long call_site, const void *ptr,
	     size_t bytes_req)
{
	return count_kmalloc(bytes_req);
}

SEC("tp_btf/kfree")
int BPF_PROG(oracle_kfree)
{
	__sync_fetch_and_add(&kfrees, 1);
	return 0;
}

SEC("tp_btf/kmem_cache_alloc")
int BPF_PROG(oracle_cache_alloc)
{
	__sync_fetch_and_add(&cache_calls, 1);
	return 0;
}

SEC("tp_btf/kmem_cache_free")
int BPF_PROG(oracle_cache_free)
{
	__sync_fetch_and_add(&cache_calls, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
