/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A slow event: one event at or above a tracer's `slow` threshold, with the
 * stacks that say why, sent to user space through the tracer's ring buffer
 * `slow_events`. Shared by the BPF side (common/slow.bpf.h) and user space.
 */
#ifndef EBPF_METRICSD_SLOW_H
#define EBPF_METRICSD_SLOW_H

#include "common/stacks.h"
#include "common/ustack.h"

#define EMD_SLOW_MAX_DEPTH EMD_STACK_MAX_DEPTH
/* A stack length: the stack was kept at the event's start but evicted since. */
#define EMD_SLOW_STACK_LOST (-1000)

struct emd_slow_event {
	__u64 ts; /* bpf_ktime_get_ns() when it ended */
	__u64 latency_ns;
	__u64 cgroup; /* the task's cgroup v2 id */
	__u64 key;    /* the tracer's label key (a syscall number...) */
	__u32 tgid;
	__u32 tid;
	__u32 slot;	  /* the histogram slot the event was counted in */
	__s32 kstack_len; /* bytes of kstack, or EMD_SLOW_STACK_LOST */
	__s32 ustack_len; /* bytes of ustack (0: a kernel thread), or
			     EMD_SLOW_STACK_LOST */
	__u32 pad;
	char comm[16];
	char label[32]; /* the tracer's label text (a disk name...), or "" */
	__u64 kstack[EMD_SLOW_MAX_DEPTH];
	__u64 ustack[EMD_SLOW_MAX_DEPTH];
};

/* A slow event with a copy of the user stack (common/slow_copy.bpf.h): the
 * record is cut after the stack bytes copied, so it is longer than an
 * emd_slow_event by the copy's header at least. */
struct emd_slow_event_copy {
	struct emd_slow_event event;
	struct emd_ustack ustack;
};

/* Who started an event that ends elsewhere (a block request issued by a task
 * and completed in an interrupt): kept from start to end. */
struct emd_slow_origin {
	__u64 cgroup;
	__u64 kstack; /* hashes in emd_stacks, 0: none */
	__u64 ustack;
	__u32 tgid;
	__u32 tid;
	char comm[16];
};

#endif
