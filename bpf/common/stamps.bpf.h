/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Start stamps of things in flight (a packet, a connect) that usually end on
 * the CPU that started them before it starts another one. Each CPU keeps its
 * newest stamp in a per-CPU slot: no lock, no hash. A stamp still in the slot
 * when the CPU starts the next one moves to a shared hash, where the end event
 * on any CPU finds it. User space sweeps stale stamps from the hash
 * (sweep_stale_stamps), so things that never end cannot fill it.
 *
 * Each user declares:
 *   EMD_STAMP_MAPS(prefix, max_in_flight);
 * which defines prefix_newest (per-CPU slot) and prefix_spilled (the hash).
 */
#ifndef EBPF_METRICSD_STAMPS_BPF_H
#define EBPF_METRICSD_STAMPS_BPF_H

#include "common/maps.bpf.h"

struct emd_stamp {
	__u64 key;
	__u64 ts;
};

#define EMD_STAMP_MAPS(prefix, max_in_flight)                                  \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, struct emd_stamp);                               \
	} prefix##_newest SEC(".maps");                                        \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, max_in_flight);                            \
		__type(key, __u64);                                            \
		__type(value, __u64);                                          \
	} prefix##_spilled SEC(".maps")

/* Records that `key` started at `ts`. A spill into a full hash counts as a drop
 * under `reason`. */
static __always_inline void emd_stamp_put(void *newest, void *spilled,
					  __u64 key, __u64 ts, void *drops_map,
					  __u32 reason)
{
	struct emd_stamp *slot;
	__u32 zero = 0;

	slot = bpf_map_lookup_elem(newest, &zero);
	if (!slot)
		return;
	if (slot->key && slot->key != key &&
	    bpf_map_update_elem(spilled, &slot->key, &slot->ts, BPF_ANY))
		emd_count_drop(drops_map, reason);
	slot->key = key;
	slot->ts = ts;
}

/* The start stamp of `key`, removed; 0 when there is none. */
static __always_inline __u64 emd_stamp_take(void *newest, void *spilled,
					    __u64 key)
{
	struct emd_stamp *slot;
	__u32 zero = 0;
	__u64 *ts, t;

	slot = bpf_map_lookup_elem(newest, &zero);
	if (slot && slot->key == key) {
		slot->key = 0;
		return slot->ts;
	}
	ts = bpf_map_lookup_elem(spilled, &key);
	if (!ts)
		return 0;
	t = *ts;
	bpf_map_delete_elem(spilled, &key);
	return t;
}

#endif
