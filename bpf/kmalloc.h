/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_KMALLOC_H
#define EBPF_METRICSD_KMALLOC_H

#include "common/log2_slot.h"

/* Histogram slots: powers of two of bytes (common/log2_slot.h). */
#define KMALLOC_SLOTS EMD_HIST_SLOTS
#define KMALLOC_CACHE_NAME_LEN 32
#define KMALLOC_MAX_CACHES 1024

struct kmalloc_totals {
	__u64 kmalloc_calls;
	__u64 kfree_calls;
	__u64 bytes_requested;
	__u64 bytes_allocated;
};

struct kmalloc_hist {
	__u64 slots[KMALLOC_SLOTS];
	__u64 sum;
};

struct kmalloc_cache_key {
	char name[KMALLOC_CACHE_NAME_LEN];
};

struct kmalloc_cache_counts {
	__u64 allocs;
	__u64 frees;
};

enum kmalloc_drop_reason {
	KMALLOC_DROP_CACHES_FULL = 0,
	KMALLOC_DROP__COUNT,
};

#endif
