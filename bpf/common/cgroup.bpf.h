/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The owner of an event as a cgroup v2 id (the kernfs node id: the inode
 * number of the cgroup's directory), for tracers with a `cgroup: true`
 * option. Labelled, a tracer keys a per-CPU hash by the id in place of its
 * plain per-CPU array: one hash lookup (an insert on a cgroup's first event)
 * in place of an array lookup. Names are found in user space at drain time.
 */
#ifndef EBPF_METRICSD_CGROUP_BPF_H
#define EBPF_METRICSD_CGROUP_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

/* Set by user space before load. Read-only data: the verifier knows its value
 * and removes the path not taken, so an unlabelled tracer pays nothing. */
const volatile __u8 emd_by_cgroup = 0;

/*
 * A tracer's labelled series: a per-CPU hash keyed by (cgroup id, ...), an
 * entry made on a label set's first event. User space sizes it from
 * label_map_entries (1 entry when labels are off, as it is then unused).
 */
#define EMD_CGROUP_MAP(name, key_type, value_type)                            \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_HASH);                        \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
		__uint(max_entries, 1);                                        \
		__type(key, key_type);                                         \
		__type(value, value_type);                                     \
	} name SEC(".maps")

/* The default-hierarchy cgroup of a task that is not the current one. */
static __always_inline __u64 emd_task_cgroup(struct task_struct *t)
{
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

#endif
