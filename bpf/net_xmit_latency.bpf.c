// SPDX-License-Identifier: GPL-2.0
/*
 * Packet queue-to-transmit latency: net_dev_queue stamps the skb,
 * net_dev_xmit (when the driver took it) adds the latency, the packet and its
 * bytes to the series of the device, named from the kernel's net_device (so a
 * device in another network namespace is named as it is there).
 * Most packets reach the driver on the CPU that queued them before it queues
 * another (devices without a qdisc, or an idle one): common/stamps.bpf.h.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include <bpf/bpf_core_read.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/stamps.bpf.h"
#include "net_xmit_latency.h"

static const struct netxmit_value zero_value = {};

#define NET_XMIT_MASK_VALUE 0x0f /* NET_XMIT_MASK: a macro, not in BTF */

EMD_STAMP_MAPS(queued, NETXMIT_MAX_IN_FLIGHT);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, NETXMIT_MAX_INTERFACES);
	__type(key, struct netxmit_key);
	__type(value, struct netxmit_value);
} series SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NETXMIT_DEV_SLOTS);
	__type(key, __u32);
	__type(value, struct netxmit_dev);
} devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NETXMIT_DEV_SLOTS);
	__type(key, __u32);
	__type(value, struct netxmit_value);
} dev_series SEC(".maps");

EMD_CGROUP_MAP(series_by_cgroup, struct netxmit_cgroup_key, struct netxmit_value);

EMD_DROPS_MAP(NETXMIT_DROP__COUNT);

/* The socket's cgroup (where it was made): since 5.15 a pointer of its own;
 * before, a word that holds the pointer when its low bit is clear. */
struct sock_cgroup_data___ptr {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sock_cgroup_data___word {
	__u64 val;
} __attribute__((preserve_access_index));

#define TCP_TIME_WAIT 6
#define TCP_NEW_SYN_RECV 12

/* The cgroup v2 id of the socket that sent the packet; 0 for a packet without
 * one (forwarded, or sent by the kernel for a mini socket). */
static __always_inline __u64 skb_cgroup(struct sk_buff *skb)
{
	struct sock *sk = BPF_CORE_READ(skb, sk);
	struct sock_cgroup_data___ptr *ptr;
	struct cgroup *cg;
	__u8 state;
	__u64 val;

	if (!sk)
		return 0;
	/* request and time-wait sockets have no cgroup data */
	state = BPF_CORE_READ(sk, __sk_common.skc_state);
	if (state == TCP_TIME_WAIT || state == TCP_NEW_SYN_RECV)
		return 0;
	ptr = (void *)&sk->sk_cgrp_data;
	if (bpf_core_field_exists(ptr->cgroup)) {
		cg = BPF_CORE_READ(ptr, cgroup);
	} else {
		val = BPF_CORE_READ((struct sock_cgroup_data___word *)ptr, val);
		if (val & 1)
			return 0;
		cg = (void *)val;
	}
	if (!cg)
		return 0;
	return BPF_CORE_READ(cg, kn, id);
}

static __always_inline int on_queue(struct sk_buff *skb)
{
	emd_stamp_put(&queued_newest, &queued_spilled, (__u64)skb,
		      bpf_ktime_get_ns(), &drops, NETXMIT_DROP_IN_FLIGHT_FULL);
	return 0;
}

static __always_inline void read_name(struct net_device *dev, char *name,
				      bool raw)
{
	if (raw)
		bpf_probe_read_kernel(name, NETXMIT_IFNAME_LEN, &dev->name);
	else /* a BTF pointer: two plain loads */
		__builtin_memcpy(name, dev->name, NETXMIT_IFNAME_LEN);
}

/*
 * Who claimed each device slot: an insert with BPF_NOEXIST is atomic, so of two
 * new devices that find one slot free at the same moment exactly one gets it
 * and the other moves on (no cmpxchg before 5.12). Consulted only on a claim.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NETXMIT_DEV_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} slot_owner SEC(".maps");

static __always_inline bool claim_slot(__u32 *idx, __u64 dev)
{
	__u64 *owner;

	if (bpf_map_update_elem(&slot_owner, idx, &dev, BPF_NOEXIST) == 0)
		return true;
	owner = bpf_map_lookup_elem(&slot_owner, idx);
	return owner && *owner == dev;
}

/*
 * The series of the device: in the per-CPU array under the device's slot (the
 * first of NETXMIT_DEV_PROBES slots from its ifindex that it owns or that is
 * free), else, when other devices hold them all, in the hash by name.
 */
static __always_inline struct netxmit_value *series_of(struct net_device *dev,
							bool raw)
{
	__u32 home = EMD_READ(raw, dev, ifindex), idx, i;
	struct netxmit_key key = {};
	struct netxmit_dev *d;

	for (i = 0; i < NETXMIT_DEV_PROBES; i++) {
		idx = (home + i) & (NETXMIT_DEV_SLOTS - 1);
		d = bpf_map_lookup_elem(&devs, &idx);
		if (!d)
			break;
		if (d->dev != (__u64)dev) {
			if (d->dev || !claim_slot(&idx, (__u64)dev))
				continue;
			d->dev = (__u64)dev;
		}
		read_name(dev, d->ifname, raw); /* follows renames */
		return bpf_map_lookup_elem(&dev_series, &idx);
	}
	read_name(dev, key.ifname, raw);
	return emd_lookup_or_init(&series, &key, &zero_value, &drops,
				  NETXMIT_DROP_INTERFACES_FULL);
}

static __always_inline int on_xmit(struct sk_buff *skb, int rc,
				   struct net_device *dev, unsigned int len,
				   bool raw)
{
	struct netxmit_value *v;
	__u64 ts;

	/* The driver took the packet unless it handed it back to be requeued
	 * (NETDEV_TX_BUSY, 0x10): it comes back then. Any code below
	 * NET_XMIT_MASK, a drop or congestion included, and any error, means
	 * the driver consumed it (dev_xmit_complete()). */
	if (rc >= NET_XMIT_MASK_VALUE)
		return 0;
	ts = emd_stamp_take(&queued_newest, &queued_spilled, (__u64)skb);
	if (emd_by_cgroup) {
		struct netxmit_cgroup_key k = { .cgroup = skb_cgroup(skb) };

		read_name(dev, k.ifname, raw);
		v = emd_lookup_or_init(&series_by_cgroup, &k, &zero_value, &drops,
				       NETXMIT_DROP_LABELS_FULL);
	} else {
		v = series_of(dev, raw);
	}
	if (!v)
		return 0;
	if (ts)
		emd_hist_add_ns(v, bpf_ktime_get_ns() - ts);
	v->packets += 1;
	v->bytes += len;
	return 0;
}

#define QUEUE(raw) on_queue(skb)
#define XMIT(raw) on_xmit(skb, rc, dev, len, raw)

EMD_TP_PROGS(net_dev_queue, net_dev_queue, QUEUE, struct sk_buff *skb)
EMD_TP_PROGS(net_dev_xmit, net_dev_xmit, XMIT, struct sk_buff *skb, int rc,
	     struct net_device *dev, unsigned int len)

char LICENSE[] SEC("license") = "GPL";
