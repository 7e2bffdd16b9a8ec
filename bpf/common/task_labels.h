/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A histogram of tasks' waits and its key when labelled by a task's cgroup
 * (`cgroup: true`) and comm (`comm: true`), shared with user space; the
 * fields of labels that are off stay 0.
 */
#ifndef EBPF_METRICSD_TASK_LABELS_H
#define EBPF_METRICSD_TASK_LABELS_H

#include "common/log2_slot.h"

struct emd_task_key {
	__u64 cgroup;
	char comm[16];
};

/* A histogram of a task's waits: log2 slots of seconds (common/log2_slot.h)
 * and the sum of ns. */
struct emd_task_hist {
	__u64 slots[EMD_HIST_SLOTS];
	__u64 sum;
};

#endif
