/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_TCP_CONNECT_LATENCY_H
#define EBPF_METRICSD_TCP_CONNECT_LATENCY_H

#include "common/log2_slot.h"

/* Histogram slots: powers of two of seconds (common/log2_slot.h). */
#define TCPCONN_SLOTS EMD_HIST_SLOTS

enum tcpconn_family {
	TCPCONN_IPV4 = 0,
	TCPCONN_IPV6 = 1,
	TCPCONN_FAMILIES,
};

struct tcpconn_hist {
	__u64 slots[TCPCONN_SLOTS];
	__u64 sum; /* ns */
};

#define TCPCONN_MAX_IN_FLIGHT 65536

/* A connect in flight: when it sent its SYN, and the connecting task's cgroup
 * (0 without `cgroup: true`). */
struct tcpconn_start {
	__u64 ts;
	__u64 cgroup;
};

/* With `cgroup: true`: histograms and failures by (cgroup, family). */
struct tcpconn_cgroup_key {
	__u64 cgroup;
	__u32 family;
	__u32 pad;
};

enum tcpconn_drop_reason {
	TCPCONN_DROP_IN_FLIGHT_FULL = 0, /* no room to remember a connect */
	TCPCONN_DROP_LABELS_FULL = 1, /* no room for another (cgroup, family) */
	TCPCONN_DROP_SLOW_LIMITED = 2,	  /* a slow connect over slow.max_per_second */
	TCPCONN_DROP_SLOW_RING_FULL = 3,  /* a slow connect with no room in the ring */
	TCPCONN_DROP_SLOW_ORIGIN_FULL = 4, /* no room for a connecting task's stack */
	TCPCONN_DROP__COUNT,
};

#endif
