/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Layout shared by profile.bpf.c and src/tracers/profile.cpp: on-CPU samples
 * and off-CPU waits, aggregated in the kernel by (thread, stacks).
 */
#ifndef EBPF_METRICSD_PROFILE_H
#define EBPF_METRICSD_PROFILE_H

enum profile_kind {
	PROFILE_ON_CPU = 0,  /* a CPU-clock sample */
	PROFILE_OFF_CPU = 1, /* a wait of at least offcpu_min */
};

/*
 * One aggregate: a thread and its kernel and user stacks, by the 64-bit hash
 * that keys each stack in emd_stacks (0: none, or not kept; the drop is
 * counted). cgroup is 0 unless `cgroup: true`.
 */
struct profile_key {
	__u32 tgid;
	__u32 tid;
	__u64 cgroup;
	__u64 kstack;
	__u64 ustack;
	char comm[16];
	__u32 kind;
	__u32 pad;
};

struct profile_value {
	__u64 count; /* samples, or waits */
	__u64 ns;    /* CPU time sampled, or time blocked */
};

/* Workloads to profile (a cgroup and its descendants), `workloads` option. */
#define PROFILE_MAX_WORKLOADS 16

enum profile_drop_reason {
	PROFILE_DROP_COUNTS_FULL = 0,  /* no room for another aggregate */
	PROFILE_DROP_THREAD_STATE = 1, /* no per-thread slot for a blocked thread */
	PROFILE_DROP_ANNOUNCE = 2,     /* a new process not announced (ring full) */
	PROFILE_DROP__COUNT,
};

#endif
