// SPDX-License-Identifier: GPL-2.0
/*
 * Syscall latency: sys_enter stamps the time in task-local storage, sys_exit
 * adds the elapsed time to a per-CPU log2 histogram of that syscall number.
 * Each hook exists as tp_btf and raw_tp; user space probes which one the
 * kernel accepts and disables autoload of the other.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SYSLAT_MAX_SYSCALLS);
	__type(key, __u32);
	__type(value, struct syscall_latency_hist);
} hists SEC(".maps");

EMD_DROPS_MAP(SYSLAT_DROP__COUNT);

static __always_inline int on_enter(long id)
{
	struct start *s;

	if ((__u64)id >= SYSLAT_MAX_SYSCALLS) {
		emd_count_drop(&drops, SYSLAT_DROP_UNKNOWN_NR);
		return 0;
	}
	if (!traced[id])
		return 0;
	s = bpf_task_storage_get(&start, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s) {
		emd_count_drop(&drops, SYSLAT_DROP_STORAGE);
		return 0;
	}
	s->nr = id;
	s->ts = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_exit(void)
{
	struct syscall_latency_hist *h;
	struct start *s;
	__u64 delta;
	__u32 nr;

	s = bpf_task_storage_get(&start, bpf_get_current_task_btf(), 0, 0);
	/* No stamp: the syscall began before we attached, or is not traced. */
	if (!s || !s->ts)
		return 0;
	delta = bpf_ktime_get_ns() - s->ts;
	nr = s->nr;
	s->ts = 0;
	h = bpf_map_lookup_elem(&hists, &nr);
	if (!h)
		return 0;
	emd_hist_add(h, delta);
	return 0;
}

#define ENTER(raw) on_enter(id)
#define EXIT(raw) on_exit()

EMD_TP_PROGS(sys_enter, sys_enter, ENTER, struct pt_regs *regs, long id)
EMD_TP_PROGS(sys_exit, sys_exit, EXIT, struct pt_regs *regs, long ret)

char LICENSE[] SEC("license") = "GPL";
