// SPDX-License-Identifier: GPL-2.0
/* An independent count of one device's net_dev_queue and net_dev_xmit
 * tracepoints, for the tests: what the kernel reported, to tell a packet the
 * tracer lost from one the tracepoints never showed. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile int ifindex = 0;
const volatile __u32 netns = 0; /* the namespace's inode: an ifindex is its own */

__u64 queued = 0;
__u64 completed = 0; /* the driver took it: rc below NET_XMIT_MASK */
__u64 busy = 0;      /* handed back to be requeued */

static __always_inline bool watched(struct net_device *dev)
{
	return dev && dev->ifindex == ifindex && dev->nd_net.net->ns.inum == netns;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(oracle_queue, struct sk_buff *skb)
{
	if (watched(skb->dev))
		__sync_fetch_and_add(&queued, 1);
	return 0;
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(oracle_xmit, struct sk_buff *skb, int rc, struct net_device *dev,
	     unsigned int len)
{
	if (!watched(dev))
		return 0;
	if (rc < 0x0f)
		__sync_fetch_and_add(&completed, 1);
	else
		__sync_fetch_and_add(&busy, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
