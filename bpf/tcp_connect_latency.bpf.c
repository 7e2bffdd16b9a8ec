// SPDX-License-Identifier: GPL-2.0
/*
 * TCP active opens: inet_sock_set_state to SYN_SENT stamps the socket; from
 * SYN_SENT, ESTABLISHED adds the latency to the family's histogram and CLOSE
 * counts a failure. Stamps are keyed by the socket's address as in
 * common/stamps.bpf.h (a loopback connect ends on the CPU that began it):
 * socket-local storage would allocate and free storage for every socket,
 * which measured three times the cost.
 *
 * With `slow` (common/slow_return.bpf.h), the connecting task's stack is kept
 * by socket at SYN_SENT, and a connect established at or above the threshold
 * is sent to user space: when a blocking connect() returns, with a copy of
 * the user stack it returns to; else (non-blocking) at once, with the stack
 * kept from SYN_SENT.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/slow_return.bpf.h"
#include "tcp_connect_latency.h"

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6

/*
 * SYN_SENT stamps by socket. A connect can leave SYN_SENT on another CPU than
 * the one it entered it on (the SYN-ACK is processed at release_sock() after a
 * migration, or in another CPU's softirq), so the stamp is in a hash that
 * every CPU sees, not in a per-CPU slot. Connects are rare next to packets;
 * the hash costs little here.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TCPCONN_MAX_IN_FLIGHT);
	__type(key, __u64);
	__type(value, struct tcpconn_start);
} start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TCPCONN_FAMILIES);
	__type(key, __u32);
	__type(value, struct tcpconn_hist);
} latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TCPCONN_FAMILIES);
	__type(key, __u32);
	__type(value, __u64);
} failures SEC(".maps");

EMD_CGROUP_MAP(latency_by_cgroup, struct tcpconn_cgroup_key, struct tcpconn_hist);

EMD_CGROUP_MAP(failures_by_cgroup, struct tcpconn_cgroup_key, __u64);

static const struct tcpconn_hist zero_hist = {};
static const __u64 zero_count = 0;

EMD_DROPS_MAP(TCPCONN_DROP__COUNT);


static __always_inline int on_set_state(void *ctx, struct sock *sk,
					int oldstate, int newstate, bool raw)
{
	struct tcpconn_start st = {}, *stamp;
	__u64 key = (__u64)sk, now;
	struct tcpconn_hist *h;
	__u32 family;
	__u64 *n;
	__u16 f;

	if (newstate != TCP_SYN_SENT && oldstate != TCP_SYN_SENT)
		return 0;
	if (EMD_READ(raw, sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	f = EMD_READ(raw, sk, __sk_common.skc_family);
	if (f != AF_INET && f != AF_INET6)
		return 0;
	family = f == AF_INET ? TCPCONN_IPV4 : TCPCONN_IPV6;
	if (newstate == TCP_SYN_SENT) {
		st.ts = bpf_ktime_get_ns();
		/* connect() runs in the connecting task */
		if (emd_by_cgroup)
			st.cgroup = bpf_get_current_cgroup_id();
		if (bpf_map_update_elem(&start, &key, &st, BPF_ANY))
			emd_count_drop(&drops, TCPCONN_DROP_IN_FLIGHT_FULL);
		/* with `slow`: the connecting task, sent if the connect proves slow */
		emd_slow_start(ctx, key, &drops, TCPCONN_DROP_SLOW_ORIGIN_FULL);
		return 0;
	}
	/* leaving SYN_SENT: to ESTABLISHED (done) or CLOSE (failed). A
	 * simultaneous open (to SYN_RECV) is not followed; its stamp is swept. */
	if (newstate != TCP_ESTABLISHED && newstate != TCP_CLOSE)
		return 0;
	stamp = bpf_map_lookup_elem(&start, &key);
	if (!stamp)
		return 0; /* the connect began before we attached */
	st = *stamp;
	bpf_map_delete_elem(&start, &key);
	now = bpf_ktime_get_ns() - st.ts;
	h = NULL;
	if (emd_by_cgroup) {
		struct tcpconn_cgroup_key k = { .cgroup = st.cgroup, .family = family };

		if (newstate == TCP_ESTABLISHED) {
			h = emd_lookup_or_init(&latency_by_cgroup, &k, &zero_hist,
					       &drops, TCPCONN_DROP_LABELS_FULL);
			if (h)
				emd_hist_add_ns(h, now);
		} else {
			n = emd_lookup_or_init(&failures_by_cgroup, &k, &zero_count,
					       &drops, TCPCONN_DROP_LABELS_FULL);
			if (n)
				*n += 1;
		}
	} else if (newstate == TCP_ESTABLISHED) {
		h = bpf_map_lookup_elem(&latency, &family);
		if (h)
			emd_hist_add_ns(h, now);
	} else {
		n = bpf_map_lookup_elem(&failures, &family);
		if (n)
			*n += 1;
	}
	/* after the count: an exemplar is set on a bucket that holds its event */
	emd_slow_end(key, now, h != NULL, family, "", st.cgroup, &drops,
		     TCPCONN_DROP_SLOW_LIMITED, TCPCONN_DROP_SLOW_RING_FULL);
	return 0;
}

#define SET_STATE(raw) on_set_state(ctx, sk, oldstate, newstate, raw)

EMD_TP_PROGS(inet_sock_set_state, inet_sock_set_state, SET_STATE,
	     struct sock *sk, int oldstate, int newstate)

EMD_SLOW_RETURN_PROGS(slow, &drops, TCPCONN_DROP_SLOW_RING_FULL)

char LICENSE[] SEC("license") = "GPL";
