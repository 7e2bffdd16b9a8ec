/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Layout shared by profile.bpf.c and src/tracers/profile.cpp: on-CPU samples
 * and off-CPU waits, aggregated in the kernel by (thread, stacks).
 */
#ifndef EBPF_METRICSD_PROFILE_H
#define EBPF_METRICSD_PROFILE_H

#include "common/stacks.h"
#include "common/ustack.h"

enum profile_kind {
	PROFILE_ON_CPU = 0,  /* a CPU-clock sample */
	PROFILE_OFF_CPU = 1, /* a wait of at least offcpu_min */
};

/*
 * One aggregate: a thread and its kernel and user stacks, by the 64-bit hash
 * that keys each stack in emd_stacks (0: none, or not kept; the drop is
 * counted). cgroup is 0 unless `cgroup: true`.
 * Waits are split by the batches user space reads (batch_begin_ns, the
 * monotonic clock of the last read): those that began in the batch they end
 * in add up under began 0; one that began before it, or ended while the maps
 * were swapped, has a key of its own, with when it began, and its value says
 * when it ended, for user space to give each window it spans its part.
 */
struct profile_key {
	__u32 tgid;
	__u32 tid;
	__u64 cgroup;
	__u64 kstack;
	__u64 ustack;
	char comm[16];
	__u32 kind;
	__s32
	    syscall; /* the system call a wait was in, -1: none (or a sample) */
	__u64 began; /* a wait that crossed a read: when it began; else 0 */
};

struct profile_value {
	__u64 count; /* samples, or waits */
	__u64 ns;    /* CPU time sampled, or time blocked */
	__u64 ended; /* with the key's began: when the wait ended */
};

/*
 * A thread as the iterator profile_threads sees it when user space reads
 * (each cut), or as it exits (the map thread_ends): the scheduler's own
 * accounting of it, and the wait it is in now (blocked 0: none), which counts
 * up to `now` in the windows that end then.
 */
struct profile_thread {
	__u32 tgid;
	__u32 tid;
	__u64 cgroup;
	__u64 start;	 /* when it began (monotonic ns, task->start_time) */
	__u64 on_cpu;	 /* ns on a CPU so far (se.sum_exec_runtime) */
	__u64 run_delay; /* ns runnable, waiting for a CPU (sched_info) */
	__u64 now;	 /* when it was seen */
	__u64 blocked;	 /* since when it is blocked, at least offcpu_min; 0 */
	__u64 kstack;	 /* the wait's stacks (ustack 0: with `unwind: cfi` */
	__u64 ustack;	 /* inside a system call, taken when it returns) */
	__u64 ip;	 /* inside a system call: where it returns to */
	__s32 syscall;	 /* the system call it waits in, -1: none */
	__u32 kernel;	 /* a kernel thread */
	char comm[16];
};

/* A process announced to user space (ring new_processes): seen for the first
 * time (again: 0), or again since it exec'd or mapped more code (again: 1),
 * for its mappings to be read (again). */
struct profile_announcement {
	__u32 tgid;
	__u32 again;
};

/* A process announced already: when, and whether it is to be announced again
 * (it exec'd, or mapped code since). */
struct profile_announced {
	__u64 at; /* bpf_ktime_get_ns() */
	__u32 again;
	__u32 pad;
};

/* A process that mapped more code is announced again at most this often. */
#define PROFILE_REANNOUNCE_NS 20000000ULL

/* Workloads to profile (a cgroup and its descendants), `workloads` option. */
#define PROFILE_MAX_WORKLOADS 16

enum profile_drop_reason {
	PROFILE_DROP_COUNTS_FULL = 0, /* no room for another aggregate */
	PROFILE_DROP_THREAD_STATE =
	    1,			   /* no per-thread slot for a blocked thread */
	PROFILE_DROP_ANNOUNCE = 2, /* a new process not announced (ring full) */
	/* Waits inside a system call kept without a user stack, by why: */
	PROFILE_DROP_SYSCALL_MISMATCH = 3, /* it returned elsewhere */
	PROFILE_DROP_SYSCALL_EXEC = 4,	   /* an execve that succeeded */
	PROFILE_DROP_SYSCALL_EXITED = 5,   /* the thread exited inside it */
	PROFILE_DROP_SYSCALL_KSTACK = 6,   /* a later wait of the call had
					      another kernel stack */
	PROFILE_DROP_STOPPED = 7,     /* a signal or tracer stop: not the call's
					 wait; kept with the frame-pointer walk */
	PROFILE_DROP_WAKE_MISSED = 8, /* a wait whose end was not seen */
	PROFILE_DROP_THREAD_END = 9,  /* a thread's last accounting not kept
					 (thread_ends full) */
	PROFILE_DROP__COUNT,
};

#endif
