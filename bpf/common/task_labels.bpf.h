/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Histograms of a task's events, labelled by its cgroup and comm when asked
 * (common/task_labels.h): a per-CPU array of one histogram when unlabelled,
 * else a per-CPU hash by label set (EMD_CGROUP_MAP).
 */
#ifndef EBPF_METRICSD_TASK_LABELS_BPF_H
#define EBPF_METRICSD_TASK_LABELS_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/task_labels.h"

/* Set by user space before load (`comm: true`). */
const volatile __u8 emd_by_comm = 0;

/* A histogram's two maps: `name`, its only entry when unlabelled, and
 * `name`_labelled, by label set (sized by user space). */
#define EMD_TASK_HIST_MAPS(name)                                               \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, struct emd_task_hist);                           \
	} name SEC(".maps");                                                   \
	EMD_CGROUP_MAP(name##_labelled, struct emd_task_key,                   \
		       struct emd_task_hist)

/*
 * Task t's histogram: the only entry of `plain`, or its label set's entry of
 * `labelled`, made on the set's first event (a full map counted under
 * `reason`).
 */
static __always_inline struct emd_task_hist *
emd_task_hist_of(struct task_struct *t, void *plain, void *labelled,
		 void *drops, __u32 reason, bool raw)
{
	static const struct emd_task_hist zero = {};
	struct emd_task_key key = {};
	__u32 first = 0;

	if (!emd_by_cgroup && !emd_by_comm)
		return bpf_map_lookup_elem(plain, &first);
	if (emd_by_cgroup) /* tp_btf: four plain loads, no helper calls */
		key.cgroup = EMD_READ(raw, t, cgroups, dfl_cgrp, kn, id);
	if (emd_by_comm)
		BPF_CORE_READ_STR_INTO(&key.comm, t, comm);
	return emd_lookup_or_init(labelled, &key, &zero, drops, reason);
}

#endif
