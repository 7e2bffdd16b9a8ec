/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_PAGE_CACHE_H
#define EBPF_METRICSD_PAGE_CACHE_H

struct page_cache_totals {
	__u64 accesses;
	__u64 misses;
	__u64 dirtied;
};

#endif
