/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_NET_XMIT_LATENCY_H
#define EBPF_METRICSD_NET_XMIT_LATENCY_H

#include "common/log2_slot.h"

/* Histogram slots: powers of two of seconds (common/log2_slot.h). */
#define NETXMIT_SLOTS EMD_HIST_SLOTS
#define NETXMIT_IFNAME_LEN 16
#define NETXMIT_MAX_INTERFACES 1024
#define NETXMIT_MAX_IN_FLIGHT 65536

/* Devices get slots of their own in arrays: home slot = ifindex, probing on. */
#define NETXMIT_DEV_SLOTS 64 /* power of two */
#define NETXMIT_DEV_PROBES 4

struct netxmit_dev {
	__u64 dev; /* struct net_device * owning the slot, 0 = free */
	char ifname[NETXMIT_IFNAME_LEN];
};

/* Series of devices without a slot, by name. */
struct netxmit_key {
	char ifname[NETXMIT_IFNAME_LEN];
};

/* With `cgroup: true`: series by (socket's cgroup, device name). */
struct netxmit_cgroup_key {
	__u64 cgroup;
	char ifname[NETXMIT_IFNAME_LEN];
};

struct netxmit_value {
	__u64 slots[NETXMIT_SLOTS];
	__u64 sum; /* ns */
	__u64 packets;
	__u64 bytes;
};

enum netxmit_drop_reason {
	NETXMIT_DROP_IN_FLIGHT_FULL = 0,
	NETXMIT_DROP_INTERFACES_FULL = 1,
	NETXMIT_DROP_LABELS_FULL = 2, /* no room for another (cgroup, device) */
	NETXMIT_DROP__COUNT,
};

#endif
