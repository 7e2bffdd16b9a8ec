/* SPDX-License-Identifier: GPL-2.0 */
/* Map helpers shared by the tracers. */
#ifndef EBPF_METRICSD_MAPS_BPF_H
#define EBPF_METRICSD_MAPS_BPF_H

#include <bpf/bpf_helpers.h>

#include "common/log2_slot.h"

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

/*
 * Adds a latency of ns nanoseconds, or a byte count, to a histogram struct
 * {__u64 slots[EMD_HIST_SLOTS]; __u64 sum;} (slot layout: log2_slot.h).
 */
#define emd_hist_add(h, v, slot_of)                                            \
	do {                                                                   \
		__u64 __v = (v);                                               \
		(h)->slots[slot_of(__v)] += 1;                                 \
		(h)->sum += __v;                                               \
	} while (0)
#define emd_hist_add_ns(h, ns) emd_hist_add(h, ns, emd_seconds_slot)
#define emd_hist_add_bytes(h, bytes) emd_hist_add(h, bytes, emd_bytes_slot)

#define EMD_EEXIST 17

/*
 * Value of key in a hash map, inserting *zero first if absent. When the map is
 * full the event is counted under drop reason `reason` and NULL returned.
 */
static __always_inline void *emd_lookup_or_init(void *map, const void *key,
						const void *zero, void *drops_map,
						__u32 reason)
{
	void *v = bpf_map_lookup_elem(map, key);
	long err;

	if (v)
		return v;
	err = bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	if (err && err != -EMD_EEXIST) {
		emd_count_drop(drops_map, reason);
		return NULL;
	}
	return bpf_map_lookup_elem(map, key);
}

#endif
