// SPDX-License-Identifier: GPL-2.0
/*
 * Programs the host-safety rule (docs/host-safety.md) must judge, never loaded: the unit
 * test only opens this object.
 *  - on_switch_storage: creates task storage on sched_switch (refused where task storage
 *    allocates from the page allocator);
 *  - on_switch_hash: inserts into a run-time allocated hash on sched_switch (its map is
 *    preallocated where hash maps allocate from the page allocator);
 *  - on_switch_subprog: calls a function of its own that creates task storage (libbpf
 *    shows a subprogram's instructions only at load, so what it calls cannot be checked:
 *    refused on every kernel);
 *  - on_switch_signal: sends a signal on sched_switch (bpf_send_signal takes the target's
 *    sighand lock and may wake it: a helper the rule does not allow under the scheduler's
 *    locks on any kernel);
 *  - on_enter_storage: creates task storage on sys_enter, where no scheduler lock is held
 *    (allowed everywhere).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} storage SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u64);
} lazily SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u64);
} eager SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch_storage, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	__u64 *v = bpf_task_storage_get(&storage, next, 0,
					BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (v)
		*v += 1;
	return 0;
}

static __noinline int count_in_storage(struct task_struct *t)
{
	__u64 *v = bpf_task_storage_get(&storage, t, 0,
					BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (v)
		*v += 1;
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch_subprog, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	return count_in_storage(next);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(on_switch_hash)
{
	__u64 key = bpf_get_smp_processor_id(), one = 1;

	bpf_map_update_elem(&lazily, &key, &one, BPF_NOEXIST);
	bpf_map_update_elem(&eager, &key, &one, BPF_NOEXIST);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch_signal, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	bpf_send_signal(10 /* SIGUSR1 */);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(on_enter_storage, struct pt_regs *regs, long id)
{
	__u64 *v = bpf_task_storage_get(&storage, bpf_get_current_task_btf(), 0,
					BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (v)
		*v += 1;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
