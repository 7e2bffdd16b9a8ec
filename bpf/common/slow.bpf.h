/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Slow-event capture for a tracer: `emd_slow_threshold_ns` (0: off) and
 * `emd_slow_per_second` are set by user space before load, the ring buffer is
 * sized by it. Below the threshold an event costs one comparison. At or above
 * it, at most emd_slow_per_second events a second (over all CPUs; a race at a
 * second's turn may let one more per CPU through) reserve a record, fill in
 * the stack that says why and submit it. The tracer counts what the limit
 * refuses and what finds the ring full under its own drop reasons. Stacks kept
 * from an event's start to its end are kept in emd_stacks
 * (common/stacks.bpf.h); a record whose kept stack was evicted carries length
 * EMD_SLOW_STACK_LOST, which user space counts.
 */
#ifndef EBPF_METRICSD_SLOW_BPF_H
#define EBPF_METRICSD_SLOW_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "common/budget.bpf.h"
#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/slow.h"
#include "common/stacks.bpf.h"

#ifndef PF_EXITING
#define PF_EXITING 0x00000004
#endif
#ifndef PF_KTHREAD
#define PF_KTHREAD 0x00200000
#endif

const volatile __u64 emd_slow_threshold_ns = 0;
const volatile __u32 emd_slow_per_second = 100;
/* Slow events sent with the user stack walked in the kernel where they are
 * waited for inside a system call (common/slow_walk.bpf.h,
 * common/slow_return.bpf.h). */
const volatile __u8 emd_slow_unwind_cfi = 0;
/* The daemon's own process: its waits are not what anyone asks about. */
const volatile __u32 emd_slow_self_tgid = 0;

EMD_BUDGET_MAP(slow_budget);

/* Sized by user space (a power of two of pages). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} slow_events SEC(".maps");

/* For events that end elsewhere than they start: their origins by the
 * tracer's key (a request, a socket), from emd_slow_start to emd_slow_end.
 * Sized by user space (1 when unused). LRU: the origin of an event whose end
 * was not seen goes once the map is full of newer ones. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct emd_slow_origin);
} slow_origins SEC(".maps");

static __always_inline bool emd_slow_admit(__u64 now, void *drops_map,
					   __u32 rate_reason)
{
	if (emd_budget_take(&slow_budget, emd_slow_per_second, now))
		return true;
	emd_count_drop(drops_map, rate_reason);
	return false;
}

/* A record for an admitted slow event, or NULL (no room: counted). */
static __always_inline struct emd_slow_event *
emd_slow_reserve_admitted(void *drops_map, __u32 full_reason)
{
	struct emd_slow_event *e;

	e = bpf_ringbuf_reserve(&slow_events, sizeof(*e), 0);
	if (!e)
		emd_count_drop(drops_map, full_reason);
	return e;
}

/* A record for a slow event, or NULL (refused or no room: counted). */
static __always_inline struct emd_slow_event *
emd_slow_reserve(__u64 now, void *drops_map, __u32 rate_reason,
		 __u32 full_reason)
{
	if (!emd_slow_admit(now, drops_map, rate_reason))
		return NULL;
	return emd_slow_reserve_admitted(drops_map, full_reason);
}

/* Whether an event of latency_ns is slow (and not the daemon's own). */
static __always_inline bool emd_slow(__u64 latency_ns, __u32 tgid)
{
	if (!emd_slow_threshold_ns || latency_ns < emd_slow_threshold_ns)
		return false;
	return tgid != emd_slow_self_tgid;
}

/*
 * The current task as the origin of an event that ends elsewhere. Taken at
 * every start, so one stack only: a user task's user stack (the code that
 * asked), a kernel thread's kernel stack (it has no other). The kernel stack
 * costs as much again (2.7 us a block request on the development machine).
 */
static __always_inline void
emd_slow_origin_here(void *ctx, struct emd_slow_origin *o, bool user)
{
	__u64 id = bpf_get_current_pid_tgid();

	o->cgroup = bpf_get_current_cgroup_id();
	o->tgid = id >> 32;
	o->tid = (__u32)id;
	bpf_get_current_comm(&o->comm, sizeof(o->comm));
	o->kstack = user ? 0 : emd_stack_take(ctx, 0, 0);
	o->ustack = user ? emd_stack_take(ctx, 1, BPF_F_USER_STACK) : 0;
	o->site.nr = -1;
}

/*
 * Fills e with a slow event started by `o`, with its kernel stack kept from
 * its start (the caller sets its user stack and `taken`): `label` is the
 * tracer's label text (up to 32 bytes), cgroup the one of its series.
 */
static __always_inline void
emd_slow_fill_origin(struct emd_slow_event *e, __u64 now, __u64 latency_ns,
		     __u32 slot, __u64 key, const char *label, __u64 cgroup,
		     const struct emd_slow_origin *o)
{
	e->ts = now;
	e->latency_ns = latency_ns;
	e->cgroup = cgroup;
	e->key = key;
	e->tgid = o->tgid;
	e->tid = o->tid;
	e->slot = slot;
	__builtin_memcpy(e->comm, o->comm, sizeof(e->comm));
	bpf_probe_read_kernel_str(e->label, sizeof(e->label), label);
	e->kstack_len =
	    emd_stack_copy(o->kstack, e->kstack, EMD_SLOW_STACK_LOST);
}

/*
 * Sends a slow event started by `o`, already admitted (emd_slow_admit), with
 * the stacks kept from its start (see emd_slow_fill_origin).
 */
static __always_inline void
emd_slow_send_origin(__u64 now, __u64 latency_ns, __u32 slot, __u64 key,
		     const char *label, __u64 cgroup,
		     const struct emd_slow_origin *o, void *drops_map,
		     __u32 full_reason)
{
	struct emd_slow_event *e;

	e = emd_slow_reserve_admitted(drops_map, full_reason);
	if (!e)
		return;
	emd_slow_fill_origin(e, now, latency_ns, slot, key, label, cgroup, o);
	e->taken = EMD_SLOW_TAKEN_AT_START;
	e->ustack_len =
	    emd_stack_copy(o->ustack, e->ustack, EMD_SLOW_STACK_LOST);
	bpf_ringbuf_submit(e, 0);
}

/*
 * Fills e with the current task's event of latency_ns (counted in histogram
 * slot `slot`, labelled by `key`): its user stack by frame pointer, its kernel
 * stack when `kernel_stack` (where the kernel stack says why; at sys_exit it
 * is only the exit path) and its cgroup.
 */
static __always_inline void emd_slow_fill(void *ctx, struct emd_slow_event *e,
					  __u64 now, __u64 latency_ns,
					  __u32 slot, __u64 key,
					  bool kernel_stack)
{
	__u64 id = bpf_get_current_pid_tgid();

	e->ts = now;
	e->latency_ns = latency_ns;
	e->cgroup = bpf_get_current_cgroup_id();
	e->key = key;
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	e->slot = slot;
	e->taken = EMD_SLOW_TAKEN_AT_RETURN;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	e->label[0] = 0;
	e->kstack_len =
	    kernel_stack ? emd_stack_take_into(ctx, e->kstack, 0) : 0;
	e->ustack_len = emd_stack_take_into(ctx, e->ustack, BPF_F_USER_STACK);
}

/*
 * Records the current task's event of latency_ns if it is slow (see
 * emd_slow_fill). ctx: the program's context.
 */
static __always_inline void emd_slow_record(void *ctx, __u64 now,
					    __u64 latency_ns, __u32 slot,
					    __u64 key, bool kernel_stack,
					    void *drops_map, __u32 rate_reason,
					    __u32 full_reason)
{
	struct emd_slow_event *e;

	if (!emd_slow_threshold_ns || latency_ns < emd_slow_threshold_ns)
		return;
	if (!emd_slow(latency_ns, bpf_get_current_pid_tgid() >> 32))
		return;
	e = emd_slow_reserve(now, drops_map, rate_reason, full_reason);
	if (!e)
		return;
	emd_slow_fill(ctx, e, now, latency_ns, slot, key, kernel_stack);
	bpf_ringbuf_submit(e, 0);
}

#endif
