// SPDX-License-Identifier: GPL-2.0
/*
 * Page faults split into minor and major. The fault tracepoints cannot tell
 * the two apart, so user space opens the perf software events
 * PAGE_FAULTS_MIN and PAGE_FAULTS_MAJ on every CPU with sample_period 1 and
 * attaches one of these programs to each: every fault the kernel accounts
 * runs the program once.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "page_faults.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PAGE_FAULT__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} faults SEC(".maps");

static __always_inline int count(__u32 type)
{
	__u64 *n = bpf_map_lookup_elem(&faults, &type);

	if (n)
		*n += 1;
	return 0;
}

SEC("perf_event")
int minor_fault(struct bpf_perf_event_data *ctx)
{
	return count(PAGE_FAULT_MINOR);
}

SEC("perf_event")
int major_fault(struct bpf_perf_event_data *ctx)
{
	return count(PAGE_FAULT_MAJOR);
}

char LICENSE[] SEC("license") = "GPL";
