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

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "page_faults.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PAGE_FAULT__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} faults SEC(".maps");

/* Preallocated: perf_event programs may not allocate map entries before 6.1. */
EMD_CGROUP_MAP_PREALLOC(faults_by_cgroup, struct page_fault_cgroup_key, __u64);

EMD_DROPS_MAP(PAGE_FAULT_DROP__COUNT);

static const __u64 zero_count = 0;

static __always_inline int count(__u32 type)
{
	__u64 *n;

	if (emd_by_cgroup) {
		/* The faulting task: the event fires in its context. */
		struct page_fault_cgroup_key k = {
			.cgroup = bpf_get_current_cgroup_id(), .type = type
		};

		n = emd_lookup_or_init(&faults_by_cgroup, &k, &zero_count, &drops,
				       PAGE_FAULT_DROP_LABELS_FULL);
	} else {
		n = bpf_map_lookup_elem(&faults, &type);
	}

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
