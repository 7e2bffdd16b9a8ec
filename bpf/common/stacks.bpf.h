/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Taking, hashing and keeping stacks, for every object that takes them (the
 * profile, slow events). A stack is kept once in emd_stacks under a 64-bit
 * hash of its frames, so that aggregates and per-thread state refer to it by
 * that hash; a second hash kept with it tells a colliding stack apart, which
 * is then not kept. Everything that cannot be kept whole is counted in
 * emd_stack_drops by reason (common/stacks.h).
 *
 * emd_stacks is an LRU hash (preallocated, as LRU maps always are: no
 * allocation in the interrupt or under the scheduler's lock that takes a
 * stack), sized by user space. A stack evicted before it was read is found
 * missing by whoever looks it up, and counted there. A sample's walk skips
 * the lookup of the stack it kept last on its CPU, at most 16 times in a row
 * (emd_walk_keep): such a stack is marked used less often.
 *
 * Scratch slots: bpf_get_stack writes into a per-CPU slot before the stack is
 * hashed. A program that can interrupt another on the same CPU (a perf event
 * sample, a syscall tracepoint) must use other slots than it, and so must a
 * program that can be preempted (the system call tracepoints' since 7.2) from
 * every program that can run on its CPU meanwhile (sched_switch runs at the
 * preemption itself).
 */
#ifndef EBPF_METRICSD_STACKS_BPF_H
#define EBPF_METRICSD_STACKS_BPF_H

#include <bpf/bpf_helpers.h>

#include "common/maps.bpf.h"
#include "common/stacks.h"

#define EMD_STACK_SCRATCH_SLOTS 6

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1); /* sized by user space */
	__type(key, __u64);
	__type(value, struct emd_stack);
} emd_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_STACK_SCRATCH_SLOTS);
	__type(key, __u32);
	__type(value, struct emd_stack);
} emd_stack_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_STACK_DROP__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} emd_stack_drops SEC(".maps");

static __always_inline __u64 emd_stack_mix(__u64 h, __u64 v, __u64 k)
{
	h ^= v;
	h *= k;
	return h ^ (h >> 29);
}

/*
 * The number of frames in len bytes written by bpf_get_stack (a negative
 * len: the helper's error), with what cannot be had counted.
 */
static __always_inline __u32 emd_stack_frames(long len)
{
	__u32 nr;

	if (len < 0) {
		emd_count_drop(&emd_stack_drops, EMD_STACK_DROP_ERROR);
		return 0;
	}
	nr = (__u32)len / 8;
	if (nr >= EMD_STACK_MAX_DEPTH) {
		nr = EMD_STACK_MAX_DEPTH;
		emd_count_drop(&emd_stack_drops, EMD_STACK_DROP_TRUNCATED);
	}
	return nr;
}

/* Whether the stack kept under a hash is s (same depth and second hash). */
static __always_inline bool emd_stack_same(const struct emd_stack *kept,
					   const struct emd_stack *s)
{
	return kept->nr == s->nr && kept->check == s->check;
}

/*
 * The hash of the nr frames of s (nr below EMD_STACK_MAX_DEPTH + 1, not 0),
 * with s->nr and its second hash s->check set.
 */
static __always_inline __u64 emd_stack_hash(struct emd_stack *s, __u32 nr)
{
	__u64 h, check;
	__u32 i;

	s->nr = nr;
	h = emd_stack_mix(0x243f6a8885a308d3ULL, nr, 0x9e3779b97f4a7c15ULL);
	check = emd_stack_mix(0x13198a2e03707344ULL, nr, 0xc2b2ae3d27d4eb4fULL);
	for (i = 0; i < EMD_STACK_MAX_DEPTH; i++) {
		if (i >= nr)
			break;
		h = emd_stack_mix(h, s->ips[i], 0x9e3779b97f4a7c15ULL);
		check = emd_stack_mix(check, s->ips[i], 0xc2b2ae3d27d4eb4fULL);
	}
	if (h == 0 || h == EMD_STACK_NOT_KEPT)
		h = 1;
	s->check = check;
	return h;
}

/* Keeps stack s of nr frames (not 0) under its hash h (emd_stack_hash): h,
 * or EMD_STACK_NOT_KEPT (counted). */
static __always_inline __u64 emd_stack_keep_hashed(struct emd_stack *s,
						   __u32 nr, __u64 h)
{
	struct emd_stack *old;
	long err;

	/* A stack seen before is kept already (the lookup marks it used). */
	old = bpf_map_lookup_elem(&emd_stacks, &h);
	if (!old) {
		err = bpf_map_update_elem(&emd_stacks, &h, s, BPF_NOEXIST);
		if (!err)
			return h;
		if (err != -EMD_EEXIST) {
			emd_count_drop(&emd_stack_drops,
				       EMD_STACK_DROP_NOT_KEPT);
			return EMD_STACK_NOT_KEPT;
		}
		/* Another CPU kept a stack under h in between: the same one? */
		old = bpf_map_lookup_elem(&emd_stacks, &h);
		if (!old) {
			emd_count_drop(&emd_stack_drops,
				       EMD_STACK_DROP_NOT_KEPT);
			return EMD_STACK_NOT_KEPT;
		}
	}
	if (!emd_stack_same(old, s)) {
		emd_count_drop(&emd_stack_drops, EMD_STACK_DROP_COLLISION);
		return EMD_STACK_NOT_KEPT;
	}
	return h;
}

/*
 * Keeps the len bytes of frames that bpf_get_stack wrote into s->ips. Returns
 * the stack's hash; 0 when there are no frames; EMD_STACK_NOT_KEPT (counted)
 * when they could not be read or kept.
 */
static __always_inline __u64 emd_stack_keep(struct emd_stack *s, long len)
{
	__u32 nr;

	if (len < 0) {
		emd_stack_frames(len); /* counts the error */
		return EMD_STACK_NOT_KEPT;
	}
	nr = emd_stack_frames(len);
	if (nr == 0)
		return 0;
	return emd_stack_keep_hashed(s, nr, emd_stack_hash(s, nr));
}

static __always_inline struct emd_stack *emd_stack_scratch_slot(__u32 slot)
{
	return bpf_map_lookup_elem(&emd_stack_scratch, &slot);
}

/*
 * Takes the current task's kernel stack (flags 0) or user stack
 * (BPF_F_USER_STACK) through scratch `slot` and keeps it: its hash, 0 or
 * EMD_STACK_NOT_KEPT as emd_stack_keep says.
 */
static __always_inline __u64 emd_stack_take(void *ctx, __u32 slot, __u64 flags)
{
	struct emd_stack *s = emd_stack_scratch_slot(slot);

	if (!s)
		return EMD_STACK_NOT_KEPT;
	return emd_stack_keep(
	    s, bpf_get_stack(ctx, s->ips, sizeof(s->ips), flags));
}

/* Takes the kernel stack of task t, which is not running, and keeps it. */
static __always_inline __u64 emd_stack_take_task(struct task_struct *t,
						 __u32 slot)
{
	struct emd_stack *s = emd_stack_scratch_slot(slot);

	if (!s)
		return EMD_STACK_NOT_KEPT;
	return emd_stack_keep(s,
			      bpf_get_task_stack(t, s->ips, sizeof(s->ips), 0));
}

/*
 * Takes the current task's stack straight into ips (EMD_STACK_MAX_DEPTH
 * frames, a record of its own): the bytes written, 0 when there are none.
 */
static __always_inline __s32 emd_stack_take_into(void *ctx, __u64 *ips,
						 __u64 flags)
{
	long len = bpf_get_stack(ctx, ips, EMD_STACK_MAX_DEPTH * 8, flags);

	return (__s32)(emd_stack_frames(len) * 8);
}

/*
 * Copies the stack kept under hash h into ips (EMD_STACK_MAX_DEPTH frames):
 * the bytes copied; 0 for h 0; `lost` when it was not kept or was evicted
 * since.
 */
static __always_inline __s32 emd_stack_copy(__u64 h, __u64 *ips, __s32 lost)
{
	struct emd_stack *s;

	if (!h)
		return 0;
	if (h == EMD_STACK_NOT_KEPT)
		return lost;
	s = bpf_map_lookup_elem(&emd_stacks, &h);
	if (!s || s->nr > EMD_STACK_MAX_DEPTH)
		return lost;
	if (bpf_probe_read_kernel(ips, EMD_STACK_MAX_DEPTH * 8, s->ips))
		return lost;
	return (__s32)(s->nr * 8);
}

#endif
