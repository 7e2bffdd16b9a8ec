/* SPDX-License-Identifier: GPL-2.0 */
/* Map helpers shared by the tracers. */
#ifndef EBPF_METRICSD_MAPS_BPF_H
#define EBPF_METRICSD_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

/*
 * Every tracer has a per-CPU array "drops" indexed by a reason code of its
 * own; user space exports it as ebpf_metricsd_dropped_events_total{reason}.
 * An event the kernel side cannot record is counted here, never lost silently.
 */
#define EMD_DROPS_MAP(nr_reasons)                                              \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, nr_reasons);                               \
		__type(key, __u32);                                            \
		__type(value, __u64);                                          \
	} drops SEC(".maps")

static __always_inline void emd_count_drop(void *drops_map, __u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(drops_map, &reason);

	if (n)
		*n += 1;
}

#endif
