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

#include <bpf/bpf_helpers.h>

/* Set by user space before load. Read-only data: the verifier knows its value
 * and removes the path not taken, so an unlabelled tracer pays nothing. */
const volatile __u8 emd_by_cgroup = 0;

/*
 * A tracer's labelled series: a per-CPU hash keyed by (cgroup id, ...), an
 * entry made on a label set's first event. User space sizes it from
 * label_map_entries (1 entry when labels are off, as it is then unused).
 * EMD_CGROUP_MAP allocates entries on first use; EMD_CGROUP_MAP_PREALLOC
 * allocates them all at load, for programs that may not allocate (perf_event
 * before 6.1) or must not (under memory pressure).
 */
#define EMD_CGROUP_MAP_FLAGS(name, key_type, value_type, flags)              \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_HASH);                        \
		__uint(map_flags, flags);                                      \
		__uint(max_entries, 1);                                        \
		__type(key, key_type);                                         \
		__type(value, value_type);                                     \
	} name SEC(".maps")
#define EMD_CGROUP_MAP(name, key_type, value_type)                            \
	EMD_CGROUP_MAP_FLAGS(name, key_type, value_type, BPF_F_NO_PREALLOC)
#define EMD_CGROUP_MAP_PREALLOC(name, key_type, value_type)                   \
	EMD_CGROUP_MAP_FLAGS(name, key_type, value_type, 0)

#endif
