/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Slow-event capture for a tracer: `emd_slow_threshold_ns` (0: off) and
 * `emd_slow_per_second` are set by user space before load, the ring buffer is
 * sized by it. Below the threshold an event costs one comparison. At or above
 * it, at most emd_slow_per_second events a second (over all CPUs; a race at a
 * second's turn may let one more per CPU through) reserve a record, take the
 * current task's kernel and user stacks into it and submit it. The tracer
 * counts what the limit refuses and what finds the ring full under its own
 * drop reasons.
 */
#ifndef EBPF_METRICSD_SLOW_BPF_H
#define EBPF_METRICSD_SLOW_BPF_H

#include <bpf/bpf_helpers.h>

#include "common/maps.bpf.h"
#include "common/slow.h"

const volatile __u64 emd_slow_threshold_ns = 0;
const volatile __u32 emd_slow_per_second = 100;
/* The daemon's own process: its waits are not what anyone asks about. */
const volatile __u32 emd_slow_self_tgid = 0;

struct emd_slow_budget {
	__u64 second;
	__u64 used;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_slow_budget);
} slow_budget SEC(".maps");

/* Sized by user space (a power of two of pages). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} slow_events SEC(".maps");

static __always_inline bool emd_slow_admit(__u64 now, void *drops_map,
					   __u32 rate_reason)
{
	struct emd_slow_budget *b;
	__u32 zero = 0;
	__u64 second = now / 1000000000ULL;

	b = bpf_map_lookup_elem(&slow_budget, &zero);
	if (!b)
		return false;
	if (b->second != second) {
		b->second = second;
		b->used = 0;
	}
	if (b->used >= emd_slow_per_second) {
		emd_count_drop(drops_map, rate_reason);
		return false;
	}
	__sync_fetch_and_add(&b->used, 1);
	return true;
}

/*
 * Records the current task's event of latency_ns (counted in histogram slot
 * `slot`, labelled by `key`) if it is slow, with its user stack, its kernel
 * stack when `kernel_stack` (where the kernel stack says why; at sys_exit it
 * is only the exit path) and its cgroup. ctx: the program's context.
 */
static __always_inline void emd_slow_record(void *ctx, __u64 now,
					    __u64 latency_ns, __u32 slot,
					    __u64 key, bool kernel_stack,
					    void *drops_map, __u32 rate_reason,
					    __u32 full_reason)
{
	struct emd_slow_event *e;
	__u64 id;

	if (!emd_slow_threshold_ns || latency_ns < emd_slow_threshold_ns)
		return;
	id = bpf_get_current_pid_tgid();
	if ((__u32)(id >> 32) == emd_slow_self_tgid)
		return;
	if (!emd_slow_admit(now, drops_map, rate_reason))
		return;
	e = bpf_ringbuf_reserve(&slow_events, sizeof(*e), 0);
	if (!e) {
		emd_count_drop(drops_map, full_reason);
		return;
	}
	e->ts = now;
	e->latency_ns = latency_ns;
	e->cgroup = bpf_get_current_cgroup_id();
	e->key = key;
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	e->slot = slot;
	e->pad = 0;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	e->kstack_len = kernel_stack ?
		bpf_get_stack(ctx, e->kstack, sizeof(e->kstack), 0) : 0;
	e->ustack_len = bpf_get_stack(ctx, e->ustack, sizeof(e->ustack),
				      BPF_F_USER_STACK);
	bpf_ringbuf_submit(e, 0);
}

#endif
