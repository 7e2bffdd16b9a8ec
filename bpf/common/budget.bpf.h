/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A budget of events a second over all CPUs, for what must not flood user
 * space (slow events): an array map of one emd_budget, declared
 * with EMD_BUDGET_MAP(name). A race at a second's turn may let one more per
 * CPU through.
 */
#ifndef EBPF_METRICSD_BUDGET_BPF_H
#define EBPF_METRICSD_BUDGET_BPF_H

#include <bpf/bpf_helpers.h>

struct emd_budget {
	__u64 second;
	__u64 used;
};

#define EMD_BUDGET_MAP(name)                                                   \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_ARRAY);                              \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, struct emd_budget);                              \
	} name SEC(".maps")

/* Whether one more event fits `per_second` in the second of `now` (ns). */
static __always_inline bool emd_budget_take(void *budget, __u32 per_second,
					    __u64 now)
{
	struct emd_budget *b;
	__u32 zero = 0;
	__u64 second = now / 1000000000ULL;

	b = bpf_map_lookup_elem(budget, &zero);
	if (!b)
		return false;
	if (b->second != second) {
		b->second = second;
		b->used = 0;
	}
	if (b->used >= per_second)
		return false;
	__sync_fetch_and_add(&b->used, 1);
	return true;
}

#endif
