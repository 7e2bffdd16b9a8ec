/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_PAGE_FAULTS_H
#define EBPF_METRICSD_PAGE_FAULTS_H

enum page_fault_type {
	PAGE_FAULT_MINOR = 0,
	PAGE_FAULT_MAJOR = 1,
	PAGE_FAULT__COUNT,
};

/* With `cgroup: true`: counts by (cgroup, type) in a per-CPU hash. */
struct page_fault_cgroup_key {
	__u64 cgroup;
	__u32 type;
	__u32 pad;
};

enum page_fault_drop_reason {
	PAGE_FAULT_DROP_LABELS_FULL = 0, /* no room for another (cgroup, type) */
	PAGE_FAULT_DROP__COUNT,
};

#endif
