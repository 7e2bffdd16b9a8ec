/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A slow event: one event at or above a tracer's `slow` threshold, with the
 * stacks that say why, sent to user space through the tracer's ring buffer
 * `slow_events`. Shared by the BPF side (common/slow.bpf.h) and user space.
 */
#ifndef EBPF_METRICSD_SLOW_H
#define EBPF_METRICSD_SLOW_H

#include "common/stacks.h"
#include "common/ustack.h" /* emd_syscall_site */

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
	__u32 taken;	  /* when the user stack was taken: EMD_SLOW_TAKEN_* */
	char comm[16];
	char label[32]; /* the tracer's label text (a disk name...), or "" */
	__u64 kstack[EMD_SLOW_MAX_DEPTH];
	__u64 ustack[EMD_SLOW_MAX_DEPTH];
};

/* emd_slow_event.taken: where its user stack comes from. */
/* Where the thread that waited for the event returned to from the system
 * call it waited in: syscall_latency's, a synchronous read, a blocking
 * connect() (a copy unwound with CFI, or a frame-pointer walk). */
#define EMD_SLOW_TAKEN_AT_RETURN 0
/* Where the thread that started the event was when it started it, walked by
 * frame pointer: where an offcpu_time wait blocked; the issuer of a request or
 * connect that nobody waited for inside that call (io_uring, AIO, writeback
 * by a flusher thread, a non-blocking connect()), or whose return could not
 * be used (enum emd_slow_return_drop_reason). */
#define EMD_SLOW_TAKEN_AT_START 1

/* Who started an event that ends elsewhere (a block request issued by a task
 * and completed in an interrupt): kept from start to end. */
struct emd_slow_origin {
	__u64 cgroup;
	__u64 kstack; /* hashes in emd_stacks, 0: none */
	__u64 ustack;
	__u32 tgid;
	__u32 tid;
	char comm[16];
	/* the system call the task was in, marked to wait for the event's end
	 * (common/slow_return.bpf.h); nr -1: none */
	struct emd_syscall_site site;
};

/* An event held for its starter's return from the call it waits in
 * (common/slow_return.bpf.h). */
struct emd_slow_held {
	struct emd_slow_origin origin;
	__u64 ts; /* bpf_ktime_get_ns() when it ended */
	__u64 latency_ns;
	__u64 cgroup; /* of its series */
	__u64 key;
	__u32 slot;
	__u32 pad;
	char label[32];
};

/* Why a slow event that its starter waited for in a system call was not sent
 * with the stack the starter returned to (common/slow_return.bpf.h), but with
 * the one kept from its start: the per-CPU array emd_slow_return_drops. */
enum emd_slow_return_drop_reason {
	/* the starter returned elsewhere than it started the event (its call
	 * returned before the event ended, in a race with the end) */
	EMD_SLOW_RETURN_MISMATCH = 0,
	EMD_SLOW_RETURN_EXITED = 1, /* the starter exited inside the call */
	EMD_SLOW_RETURN_FULL = 2,   /* no room to mark or hold it */
	/* the starter exec'd in the call (execve reading the new program): it
	 * returns to another program */
	EMD_SLOW_RETURN_EXEC = 3,
	/* another event of the same call was held already (one is held per
	 * call: the second slow request of an fsync) */
	EMD_SLOW_RETURN_SECOND = 4,
	EMD_SLOW_RETURN__COUNT,
};

#endif
