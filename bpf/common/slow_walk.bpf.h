/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Slow events that end in their own thread on its way back to user space
 * (sys_exit), sent with the user stack it returns to, walked in the kernel
 * with the unwind tables (common/unwind.bpf.h) when `emd_slow_unwind_cfi` is
 * set: the caller of a libc wrapper (which keeps no frame) and code built
 * without frame pointers are found. Without it, the frame-pointer walk.
 *
 * The walk runs in the object's sys_exit walker (EMD_SLOW_WALKERS), which
 * sends the event once the stack has ended; the prog arrays that lead there
 * are filled by user space after load.
 */
#ifndef EBPF_METRICSD_SLOW_WALK_BPF_H
#define EBPF_METRICSD_SLOW_WALK_BPF_H

#include "common/slow.bpf.h"
#include "common/unwind.bpf.h"

struct emd_slow_walkers {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} emd_slow_walkers_btf SEC(".maps"), emd_slow_walkers_raw SEC(".maps");

/* What a slow event's walk carries to the walker (emd_walk.caller). */
struct emd_slow_walk_caller {
	__u64 ts, latency_ns, cgroup, key;
	__u64 kstack; /* its kernel stack's hash in emd_stacks, 0: none */
	__u32 tgid, tid, slot, pad;
	char comm[16];
	char label[32];
};

/* A walk of a slow event is done: the event goes with the stack it found. */
static __always_inline void emd_slow_walk_send(void *ctx, struct emd_walk *w,
					       void *drops_map,
					       __u32 full_reason)
{
	struct emd_slow_walk_caller *c = (void *)w->caller;
	struct emd_slow_event *e;
	__u32 nr = w->stack.nr;

	e = bpf_ringbuf_reserve(&slow_events, sizeof(*e), 0);
	if (!e) {
		emd_count_drop(drops_map, full_reason);
		return;
	}
	e->ts = c->ts;
	e->latency_ns = c->latency_ns;
	e->cgroup = c->cgroup;
	e->key = c->key;
	e->tgid = c->tgid;
	e->tid = c->tid;
	e->slot = c->slot;
	e->taken = EMD_SLOW_TAKEN_AT_RETURN;
	__builtin_memcpy(e->comm, c->comm, sizeof(e->comm));
	__builtin_memcpy(e->label, c->label, sizeof(e->label));
	e->kstack_len =
	    emd_stack_copy(c->kstack, e->kstack, EMD_SLOW_STACK_LOST);
	if (nr > EMD_SLOW_MAX_DEPTH)
		nr = EMD_SLOW_MAX_DEPTH;
	/* Copied whole (a constant size), the frames past nr unused. */
	if (bpf_probe_read_kernel(e->ustack, sizeof(e->ustack), w->stack.ips))
		nr = 0;
	e->ustack_len = (__s32)(nr * sizeof(__u64));
	bpf_ringbuf_submit(e, 0);
}

/*
 * The walker programs of an object's slow events, tp_btf and raw_tp (user
 * space loads the one of the object's sys_exit hook kind), the sending of the
 * event with the tracer's drops map and reason for a full ring, and the exit
 * program (EMD_UNWIND_EXIT_PROG).
 */
#define EMD_SLOW_WALKERS(drops_map, full_reason)                               \
	static __always_inline void emd_slow_walked(void *ctx,                 \
						    struct emd_walk *w)        \
	{                                                                      \
		emd_slow_walk_send(ctx, w, drops_map, full_reason);            \
	}                                                                      \
	SEC("tp_btf/sys_exit")                                                 \
	int BPF_PROG(emd_slow_walk_btf, struct pt_regs *regs, long ret)        \
	{                                                                      \
		EMD_WALK_RUN(ctx, EMD_WALK_SLOT_TASK, &emd_slow_walkers_btf,   \
			     emd_slow_walked);                                 \
		return 0;                                                      \
	}                                                                      \
	SEC("raw_tp/sys_exit")                                                 \
	int BPF_PROG(emd_slow_walk_raw, struct pt_regs *regs, long ret)        \
	{                                                                      \
		EMD_WALK_RUN(ctx, EMD_WALK_SLOT_TASK, &emd_slow_walkers_raw,   \
			     emd_slow_walked);                                 \
		return 0;                                                      \
	}                                                                      \
	EMD_UNWIND_EXIT_PROG(emd_slow_walk_exit)

/*
 * Starts the walk of the current task's user stack from the user registers
 * `regs` it returns to, for a slow event whose fields are in c, and hands it
 * to the walker of the sys_exit hook kind (`raw`). Where no walker runs, the
 * event goes with the frame the task returns to.
 */
static __always_inline void emd_slow_walk(void *ctx, const struct pt_regs *regs,
					  const struct emd_slow_walk_caller *c,
					  bool raw, void *drops_map,
					  __u32 full_reason)
{
	struct emd_user_regs r = {};
	struct emd_walk *w;

	if (bpf_probe_read_kernel(&r, sizeof(r), regs))
		r.cs = 0;
	w = emd_walk_begin(EMD_WALK_SLOT_TASK, r.ip, r.sp, r.bp, r.cs);
	if (!w)
		return;
	__builtin_memcpy(w->caller, c, sizeof(*c));
	if (raw)
		EMD_WALK_HAND_OFF(ctx, w, &emd_slow_walkers_raw);
	else
		EMD_WALK_HAND_OFF(ctx, w, &emd_slow_walkers_btf);
	emd_slow_walk_send(ctx, w, drops_map, full_reason);
}

/*
 * As emd_slow_record, at sys_exit: `regs` are the user registers the
 * tracepoint gives, `raw` its hook kind.
 */
static __always_inline void
emd_slow_record_at_exit(void *ctx, const struct pt_regs *regs, __u64 now,
			__u64 latency_ns, __u32 slot, __u64 key,
			void *drops_map, __u32 rate_reason, __u32 full_reason,
			bool raw)
{
	struct emd_slow_walk_caller c = {};
	__u64 id = bpf_get_current_pid_tgid();

	if (!emd_slow_unwind_cfi) {
		emd_slow_record(ctx, now, latency_ns, slot, key, false,
				drops_map, rate_reason, full_reason);
		return;
	}
	if (!emd_slow_threshold_ns || latency_ns < emd_slow_threshold_ns)
		return;
	if (!emd_slow(latency_ns, id >> 32))
		return;
	if (!emd_slow_admit(now, drops_map, rate_reason))
		return;
	c.ts = now;
	c.latency_ns = latency_ns;
	c.cgroup = bpf_get_current_cgroup_id();
	c.key = key;
	c.tgid = id >> 32;
	c.tid = (__u32)id;
	c.slot = slot;
	bpf_get_current_comm(&c.comm, sizeof(c.comm));
	emd_slow_walk(ctx, regs, &c, raw, drops_map, full_reason);
}

#endif
