// SPDX-License-Identifier: GPL-2.0
/*
 * Where the time goes, as stacks:
 *  - on-CPU: a CPU-clock perf event in frequency mode on every CPU runs
 *    on_cpu_sample; each sample adds its period (ns of CPU time) to the
 *    interrupted thread's (kernel stack, user stack);
 *  - off-CPU: at sched_switch a thread that blocks leaves its user stack and
 *    the time in per-thread state (taking the user stack is the cost of each
 *    blocking switch); when it is switched in again after at least
 *    offcpu_min, its kernel stack is taken where it still waits and the wait
 *    is added to its (kernel stack, user stack). A shorter wait costs one
 *    comparison more.
 * Stacks are kept once each by a 64-bit hash of their frames
 * (common/stacks.bpf.h); aggregates in the inner map that `counts_slot`
 * points to. User space
 * swaps that inner map for an empty one (the update waits for programs still
 * running with the old one) and reads the old one whole: nothing is lost
 * between reads. What cannot be kept is counted in `drops`.
 * A process is announced to user space (new_processes) the first time it is
 * seen, and again after it execs, so that its mappings are read while it lives:
 * a process that exits before the next read is still symbolized.
 * The off-CPU state machine is common/offcpu.bpf.h, as offcpu_time's.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/offcpu.bpf.h"
#include "common/stacks.bpf.h"
#include "profile.h"

#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000

/* Set by user space before load. */
const volatile __u8 on_cpu_on = 1;
const volatile __u8 off_cpu_on = 1;
const volatile __u64 offcpu_min_ns = 1000000;
const volatile __u32 nr_workloads = 0; /* 0: every workload */

/* Two aggregate maps, one of them in counts_slot at a time. Preallocated:
 * an inner map's flags must match the slot's template on every kernel. */
struct counts_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct profile_key);
	__type(value, struct profile_value);
} counts_a SEC(".maps"), counts_b SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct counts_map);
} counts_slot SEC(".maps") = {
	.values = { [0] = &counts_a },
};

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, PROFILE_MAX_WORKLOADS);
	__type(key, __u32);
	__type(value, __u32);
} workloads SEC(".maps");

/* Processes announced already; an evicted one is announced again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} announced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} new_processes SEC(".maps");

EMD_DROPS_MAP(PROFILE_DROP__COUNT);

/* Tells user space about process tgid unless it knows it already. */
static __always_inline void announce(__u32 tgid)
{
	static const __u8 one = 1;

	if (bpf_map_lookup_elem(&announced, &tgid))
		return;
	if (bpf_ringbuf_output(&new_processes, &tgid, sizeof(tgid), 0)) {
		emd_count_drop(&drops, PROFILE_DROP_ANNOUNCE);
		return;
	}
	bpf_map_update_elem(&announced, &tgid, &one, BPF_ANY);
}

/* Whether the current task belongs to one of the configured workloads. */
static __always_inline bool wanted(void)
{
	__u32 i;

	if (nr_workloads == 0)
		return true;
	for (i = 0; i < PROFILE_MAX_WORKLOADS; i++) {
		if (i >= nr_workloads)
			break;
		if (bpf_current_task_under_cgroup(&workloads, i) == 1)
			return true;
	}
	return false;
}

static __always_inline void add(struct profile_key *key, __u64 ns)
{
	static const struct profile_value zero = {};
	struct profile_value *v;
	__u32 slot = 0;
	void *counts;

	counts = bpf_map_lookup_elem(&counts_slot, &slot);
	if (!counts)
		return;
	v = emd_lookup_or_init(counts, key, &zero, &drops,
			       PROFILE_DROP_COUNTS_FULL);
	if (!v)
		return;
	__sync_fetch_and_add(&v->count, 1);
	__sync_fetch_and_add(&v->ns, ns);
}

static __always_inline bool user_task(void)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();

	return !(BPF_CORE_READ(t, flags) & PF_KTHREAD);
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct profile_key key = {};

	if (!on_cpu_on || (__u32)id == 0) /* the idle task is not work */
		return 0;
	if (!wanted())
		return 0;
	key.tgid = id >> 32;
	key.tid = (__u32)id;
	key.kind = PROFILE_ON_CPU;
	if (emd_by_cgroup)
		key.cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	key.kstack = emd_stack_take(ctx, 0, 0);
	if (user_task()) {
		key.ustack = emd_stack_take(ctx, 1, BPF_F_USER_STACK);
		announce(key.tgid);
	}
	add(&key, ctx->sample_period);
	return 0;
}

static __always_inline int on_switch(void *ctx, bool preempt,
				     struct task_struct *prev,
				     struct task_struct *next,
				     unsigned int prev_state, bool raw)
{
	struct emd_offcpu *s;
	struct profile_key key = {};
	__u64 now, waited = 0;

	if (!off_cpu_on)
		return 0;
	now = bpf_ktime_get_ns();

	/* prev, the current task, blocks: its stacks are where it waits. A task
	 * that exits switches out for good. Its user stack can only be taken
	 * now, while it is current. Its kernel stack stays as it is until it
	 * runs again: with a BTF task pointer (tp_btf) it is taken then, and only
	 * for a wait of at least offcpu_min; raw_tp has no task pointer the
	 * helper accepts, so it takes it now. */
	if (emd_offcpu_blocks(preempt, prev_state) &&
	    !(EMD_READ(raw, prev, flags) & PF_EXITING) && wanted()) {
		s = emd_offcpu_block(prev, now, raw, &drops,
				     PROFILE_DROP_THREAD_STATE);
		if (s) {
			if (raw)
				s->kstack = emd_stack_take(ctx, 2, 0);
			if (!(EMD_READ(raw, prev, flags) & PF_KTHREAD)) {
				s->ustack = emd_stack_take(ctx, 3,
							   BPF_F_USER_STACK);
				announce(EMD_READ(raw, prev, tgid));
			}
		}
	}

	s = emd_offcpu_wake(next, now, &waited, raw, false, &drops,
			    PROFILE_DROP_THREAD_STATE);
	if (!s || waited < offcpu_min_ns)
		return 0;
	key.tgid = EMD_READ(raw, next, tgid);
	key.tid = EMD_READ(raw, next, pid);
	key.kind = PROFILE_OFF_CPU;
	key.kstack = raw ? s->kstack : emd_stack_take_task(next, 2);
	key.ustack = s->ustack;
	if (emd_by_cgroup)
		key.cgroup = EMD_READ(raw, next, cgroups, dfl_cgrp, kn, id);
	BPF_CORE_READ_STR_INTO(&key.comm, next, comm);
	add(&key, waited);
	return 0;
}

#define SWITCH(preempt, prev, next, prev_state, raw)                          \
	on_switch(ctx, preempt, prev, next, prev_state, raw)

EMD_SCHED_SWITCH_PROGS(offcpu_switch, SWITCH)

/* A process that execs maps other files: announce it again when next seen. */
SEC("raw_tp/sched_process_exec")
int BPF_PROG(profile_exec, struct task_struct *p)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);

	bpf_map_delete_elem(&announced, &tgid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
