/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A stack as the kernel side keeps it (common/stacks.bpf.h), shared with user
 * space: return addresses, innermost first.
 */
#ifndef EBPF_METRICSD_STACKS_H
#define EBPF_METRICSD_STACKS_H

/* perf's own ceiling (sysctl kernel.perf_event_max_stack defaults to it). A
 * stack of exactly this many frames cannot be told from a deeper one: it is
 * counted as truncated. */
#define EMD_STACK_MAX_DEPTH 127

/* The hash of a stack that was taken but could not be kept (0: none taken). */
#define EMD_STACK_NOT_KEPT ((__u64)-1)

struct emd_stack {
	__u32 nr; /* frames in ips */
	__u32 pad;
	__u64 check; /* a second hash of the frames: tells two stacks of one key
			apart */
	__u64 ips[EMD_STACK_MAX_DEPTH];
};

/* Why a stack was not kept whole: the per-CPU array emd_stack_drops. */
enum emd_stack_drop_reason {
	EMD_STACK_DROP_ERROR = 0,     /* the helper failed: no stack */
	EMD_STACK_DROP_TRUNCATED = 1, /* deeper than EMD_STACK_MAX_DEPTH: cut */
	EMD_STACK_DROP_COLLISION = 2, /* another stack has its hash: not kept */
	EMD_STACK_DROP_NOT_KEPT = 3,  /* the map refused it: not kept */
	EMD_STACK_DROP__COUNT,
};

#endif
