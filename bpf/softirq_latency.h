/* SPDX-License-Identifier: GPL-2.0 */
/* Layout shared by softirq_latency.bpf.c and src/tracers/softirq_latency.cpp. */
#ifndef EBPF_METRICSD_SOFTIRQ_LATENCY_H
#define EBPF_METRICSD_SOFTIRQ_LATENCY_H

#include "common/log2_slot.h"

#define SOFTIRQ_VECTORS 10 /* NR_SOFTIRQS, the same on every kernel since 4.x */

/* Per vector and CPU: the handler runs, the time from a raise to the handler
 * starting, and the handler's run time (log2 slots of seconds and the sum of
 * ns). Side by side, as the columns user space drains. */
struct softirq_stats {
	__u64 entries;
	__u64 latency[EMD_HIST_SLOTS];
	__u64 latency_sum;
	__u64 runtime[EMD_HIST_SLOTS];
	__u64 runtime_sum;
};

enum softirq_drop_reason {
	SOFTIRQ_DROP_UNSEEN_RAISE = 0, /* a handler ran with no raise seen: no latency */
	SOFTIRQ_DROP_UNSEEN_ENTRY = 1, /* a handler ended with no start seen: no run time */
	SOFTIRQ_DROP_VECTOR = 2,       /* a vector number beyond SOFTIRQ_VECTORS */
	SOFTIRQ_DROP__COUNT,
};

#endif
