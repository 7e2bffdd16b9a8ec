/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_PAGE_CACHE_H
#define EBPF_METRICSD_PAGE_CACHE_H

struct page_cache_totals {
	__u64 accesses;
	__u64 misses;
	__u64 dirtied;
};

enum page_cache_drop_reason {
	PAGE_CACHE_DROP_LABELS_FULL = 0, /* no room for another cgroup */
	PAGE_CACHE_DROP__COUNT,
};

#endif
