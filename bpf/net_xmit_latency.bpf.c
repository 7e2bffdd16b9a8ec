// SPDX-License-Identifier: GPL-2.0
/*
 * Packet queue-to-transmit latency: net_dev_queue stamps the skb,
 * net_dev_xmit (when the driver took it) adds the latency, the packet and its
 * bytes to the series of the device, named from the kernel's net_device (so a
 * device in another network namespace is named as it is there).
 *
 * Most packets reach the driver on the CPU that queued them before that CPU
 * queues another (devices without a qdisc, or an idle qdisc), so the newest
 * stamp of each CPU sits in a per-CPU slot and costs no hash operation. A
 * stamp still in the slot when the CPU queues the next packet moves to the
 * shared hash, where net_dev_xmit on any CPU finds it. Stamps of skbs that
 * never reach net_dev_xmit are swept from the hash by user space.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "net_xmit_latency.h"

static const struct netxmit_value zero_value = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NETXMIT_MAX_IN_FLIGHT);
	__type(key, __u64); /* struct sk_buff * */
	__type(value, __u64);
} queued SEC(".maps");

struct stamp {
	__u64 skb;
	__u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stamp);
} newest SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, NETXMIT_MAX_INTERFACES);
	__type(key, struct netxmit_key);
	__type(value, struct netxmit_value);
} series SEC(".maps");

EMD_DROPS_MAP(NETXMIT_DROP__COUNT);

static __always_inline int on_queue(struct sk_buff *skb)
{
	__u64 now = bpf_ktime_get_ns();
	struct stamp *slot;
	__u32 zero = 0;

	slot = bpf_map_lookup_elem(&newest, &zero);
	if (!slot)
		return 0;
	if (slot->skb && bpf_map_update_elem(&queued, &slot->skb, &slot->ts,
					     BPF_ANY))
		emd_count_drop(&drops, NETXMIT_DROP_IN_FLIGHT_FULL);
	slot->skb = (__u64)skb;
	slot->ts = now;
	return 0;
}

static __always_inline int on_xmit(struct sk_buff *skb, int rc,
				   struct net_device *dev, unsigned int len,
				   bool raw)
{
	struct netxmit_key key = {};
	struct netxmit_value *v;
	__u64 skbkey = (__u64)skb, *ts, delta = 0;
	struct stamp *slot;
	bool timed = false;
	__u32 zero = 0;

	if (rc != 0) /* not NETDEV_TX_OK: the skb is requeued and comes back */
		return 0;
	slot = bpf_map_lookup_elem(&newest, &zero);
	if (slot && slot->skb == skbkey) {
		delta = bpf_ktime_get_ns() - slot->ts;
		timed = true;
		slot->skb = 0;
	} else {
		ts = bpf_map_lookup_elem(&queued, &skbkey);
		if (ts) {
			delta = bpf_ktime_get_ns() - *ts;
			timed = true;
			bpf_map_delete_elem(&queued, &skbkey);
		}
	}
	if (raw)
		bpf_probe_read_kernel(key.ifname, sizeof(key.ifname), &dev->name);
	else /* a BTF pointer: two plain loads */
		__builtin_memcpy(key.ifname, dev->name, sizeof(key.ifname));
	v = emd_lookup_or_init(&series, &key, &zero_value, &drops,
			       NETXMIT_DROP_INTERFACES_FULL);
	if (!v)
		return 0;
	if (timed)
		emd_hist_add(v, delta);
	v->packets += 1;
	v->bytes += len;
	return 0;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(net_dev_queue_btf, struct sk_buff *skb)
{
	return on_queue(skb);
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(net_dev_xmit_btf, struct sk_buff *skb, int rc,
	     struct net_device *dev, unsigned int len)
{
	return on_xmit(skb, rc, dev, len, false);
}

SEC("raw_tp/net_dev_queue")
int BPF_PROG(net_dev_queue_raw, struct sk_buff *skb)
{
	return on_queue(skb);
}

SEC("raw_tp/net_dev_xmit")
int BPF_PROG(net_dev_xmit_raw, struct sk_buff *skb, int rc,
	     struct net_device *dev, unsigned int len)
{
	return on_xmit(skb, rc, dev, len, true);
}

char LICENSE[] SEC("license") = "GPL";
