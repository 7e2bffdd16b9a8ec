/* SPDX-License-Identifier: GPL-2.0 */
/* Layout shared by syscall_latency.bpf.c and src/tracers/syscall_latency.cpp. */
#ifndef EBPF_METRICSD_SYSCALL_LATENCY_H
#define EBPF_METRICSD_SYSCALL_LATENCY_H

#include "common/log2_slot.h"

/* Syscall numbers at or above this are counted as drops (x32 numbers, -1). */
#define SYSLAT_MAX_SYSCALLS 512
/* Histogram slots: powers of two of seconds (common/log2_slot.h). */
#define SYSLAT_SLOTS EMD_HIST_SLOTS

/* One entry per syscall number in a per-CPU array: no hashing, no locks. */
struct syscall_latency_hist {
	__u64 slots[SYSLAT_SLOTS];
	__u64 sum; /* ns */
};

/* With `cgroup: true`: histograms by (cgroup, syscall) in a per-CPU hash. */
struct syscall_latency_cgroup_key {
	__u64 cgroup;
	__u32 nr;
	__u32 pad;
};

enum syscall_latency_drop_reason {
	SYSLAT_DROP_STORAGE = 0,     /* no room for the thread's stamp */
	SYSLAT_DROP_UNKNOWN_NR = 1,  /* syscall number outside the table */
	SYSLAT_DROP_LABELS_FULL = 2, /* no room for another (cgroup, syscall) */
	SYSLAT_DROP_SLOW_LIMITED = 3,  /* a slow syscall over slow.max_per_second */
	SYSLAT_DROP_SLOW_RING_FULL = 4, /* a slow syscall with no room in the ring */
	SYSLAT_DROP__COUNT,
};

#endif
