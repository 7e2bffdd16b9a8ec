// SPDX-License-Identifier: GPL-2.0
/*
 * Syscall latency: sys_enter stamps the time, sys_exit adds the elapsed time
 * to a per-CPU log2 histogram of that syscall number. Each hook exists as
 * tp_btf, stamping in task-local storage, and raw_tp, stamping in a hash keyed
 * by thread id (for kernels whose tracing programs have no task storage,
 * before 5.12, or no BTF-typed task): user space loads the first kind the
 * kernel takes. A syscall at or above the `slow` threshold is also sent to
 * user space with the caller's user stack, walked in the kernel with the
 * unwind tables or by frame pointer (common/slow_walk.bpf.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/slow_walk.bpf.h"
#include "syscall_latency.h"

/* Set by user space before load from the include/exclude options. */
const volatile __u8 traced[SYSLAT_MAX_SYSCALLS] = {};

struct start {
	__u64 ts;
	__u32 nr;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct start);
} start SEC(".maps");

/* raw_tp only; user space sizes it (1 entry with tp_btf) and the thread's
 * entry is removed when it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct start);
} start_by_tid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SYSLAT_MAX_SYSCALLS);
	__type(key, __u32);
	__type(value, struct syscall_latency_hist);
} hists SEC(".maps");

EMD_CGROUP_MAP(hists_by_cgroup, struct syscall_latency_cgroup_key,
	       struct syscall_latency_hist);

static const struct syscall_latency_hist zero_hist = {};

EMD_DROPS_MAP(SYSLAT_DROP__COUNT);

static __always_inline struct start *thread_start(bool create, bool raw)
{
	static const struct start zero = {};
	__u32 tid;

	if (!raw) {
		struct start *s = bpf_task_storage_get(
		    &start, bpf_get_current_task_btf(), 0,
		    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);

		if (!s && create)
			emd_count_drop(&drops, SYSLAT_DROP_STORAGE);
		return s;
	}
	tid = (__u32)bpf_get_current_pid_tgid();
	if (!create)
		return bpf_map_lookup_elem(&start_by_tid, &tid);
	return emd_lookup_or_init(&start_by_tid, &tid, &zero, &drops,
				  SYSLAT_DROP_STORAGE);
}

static __always_inline int on_enter(long id, bool raw)
{
	struct start *s;

	if ((__u64)id >= SYSLAT_MAX_SYSCALLS) {
		emd_count_drop(&drops, SYSLAT_DROP_UNKNOWN_NR);
		return 0;
	}
	if (!traced[id])
		return 0;
	s = thread_start(true, raw);
	if (!s)
		return 0;
	s->nr = id;
	s->ts = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_exit(void *ctx, const struct pt_regs *regs,
				   long ret, bool raw)
{
	struct syscall_latency_hist *h;
	struct start *s;
	__u64 now, delta;
	__u32 nr;

	if (emd_slow_unwind_cfi)
		emd_unwind_syscall_returns(regs, ret);
	s = thread_start(false, raw);
	/* No stamp: the syscall began before we attached, or is not traced. */
	if (!s || !s->ts)
		return 0;
	now = bpf_ktime_get_ns();
	delta = now - s->ts;
	nr = s->nr;
	s->ts = 0;
	if (emd_by_cgroup) {
		/* The calling task: sys_exit runs in its context. */
		struct syscall_latency_cgroup_key k = {
		    .cgroup = bpf_get_current_cgroup_id(), .nr = nr};

		h = emd_lookup_or_init(&hists_by_cgroup, &k, &zero_hist, &drops,
				       SYSLAT_DROP_LABELS_FULL);
	} else {
		h = bpf_map_lookup_elem(&hists, &nr);
	}
	if (!h)
		return 0;
	emd_hist_add_ns(h, delta);
	emd_slow_record_at_exit(ctx, regs, now, delta, emd_seconds_slot(delta),
				nr, &drops, SYSLAT_DROP_SLOW_LIMITED,
				SYSLAT_DROP_SLOW_RING_FULL, raw);
	return 0;
}

#define ENTER(raw) on_enter(id, raw)
#define EXIT(raw) on_exit(ctx, regs, ret, raw)

EMD_TP_PROGS(sys_enter, sys_enter, ENTER, struct pt_regs *regs, long id)
EMD_TP_PROGS(sys_exit, sys_exit, EXIT, struct pt_regs *regs, long ret)

EMD_SLOW_WALKERS(&drops, SYSLAT_DROP_SLOW_RING_FULL)

/* raw_tp: a thread's stamp goes with the thread (its last syscall, exit,
 * never returns). */
SEC("raw_tp/sched_process_exit")
int BPF_PROG(thread_exit_raw)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&start_by_tid, &tid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
