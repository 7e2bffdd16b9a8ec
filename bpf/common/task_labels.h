/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The key of a histogram labelled by a task's cgroup (`cgroup: true`) and
 * comm (`comm: true`), shared with user space; the fields of labels that are
 * off stay 0.
 */
#ifndef EBPF_METRICSD_TASK_LABELS_H
#define EBPF_METRICSD_TASK_LABELS_H

struct emd_task_key {
	__u64 cgroup;
	char comm[16];
};

#endif
