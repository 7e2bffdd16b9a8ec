/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Slow events that end in their own thread on its way back to user space
 * (sys_exit), sent with a copy of the user stack and the user registers
 * (common/ustack.bpf.h) when `emd_slow_unwind_cfi` is set, for the daemon to
 * unwind with CFI: the caller of a libc wrapper (which keeps no frame) and
 * code built without frame pointers are found. The frame-pointer walk goes
 * with it, and alone where no copy can be made (counted under the ustack_*
 * drop reasons). The slow budget (emd_slow_per_second) bounds the copies.
 */
#ifndef EBPF_METRICSD_SLOW_COPY_BPF_H
#define EBPF_METRICSD_SLOW_COPY_BPF_H

#include "common/slow.bpf.h"
#include "common/ustack.bpf.h"

/* Where a record with a copy is made: too large for the BPF stack, and
 * ringbuf_reserve needs a constant size (the record is cut after the bytes
 * copied). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_slow_event_copy);
} emd_slow_copies SEC(".maps");

/*
 * Sends c, whose event is filled in, with a copy of the current task's user
 * stack from the user registers `regs` it returns to from a system call;
 * without it (counted under the ustack_* drop reasons) where none can be made.
 */
static __always_inline void emd_slow_send_copy(struct emd_slow_event_copy *c,
					       const struct pt_regs *regs,
					       void *drops_map,
					       __u32 full_reason)
{
	if (emd_has_user_stack() && emd_ustack_regs(&c->ustack, regs) &&
	    emd_ustack_copy(&c->ustack)) {
		__u64 len =
		    (__u64)((void *)c->ustack.data - (void *)c) + c->ustack.len;

		if (len > sizeof(*c))
			len = sizeof(*c);
		if (bpf_ringbuf_output(&slow_events, c, len, 0))
			emd_count_drop(drops_map, full_reason);
		return;
	}
	if (bpf_ringbuf_output(&slow_events, &c->event, sizeof(c->event), 0))
		emd_count_drop(drops_map, full_reason);
}

/* The per-CPU record to fill for emd_slow_send_copy. */
static __always_inline struct emd_slow_event_copy *emd_slow_copy_record(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&emd_slow_copies, &zero);
}

/*
 * As emd_slow_record, at sys_exit: `regs` are the user registers the
 * tracepoint gives.
 */
static __always_inline void
emd_slow_record_at_exit(void *ctx, const struct pt_regs *regs, __u64 now,
			__u64 latency_ns, __u32 slot, __u64 key,
			void *drops_map, __u32 rate_reason, __u32 full_reason)
{
	struct emd_slow_event_copy *c;

	if (!emd_slow_unwind_cfi) {
		emd_slow_record(ctx, now, latency_ns, slot, key, false,
				drops_map, rate_reason, full_reason);
		return;
	}
	if (!emd_slow_threshold_ns || latency_ns < emd_slow_threshold_ns)
		return;
	if (!emd_slow(latency_ns, bpf_get_current_pid_tgid() >> 32))
		return;
	if (!emd_slow_admit(now, drops_map, rate_reason))
		return;
	c = emd_slow_copy_record();
	if (!c)
		return;
	emd_slow_fill(ctx, &c->event, now, latency_ns, slot, key, false);
	emd_slow_send_copy(c, regs, drops_map, full_reason);
}

#endif
