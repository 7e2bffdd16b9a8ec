// SPDX-License-Identifier: GPL-2.0
/*
 * Where the kernel saves a task's user registers, as an offset from the task's
 * kernel stack (task->stack): what common/ustack.bpf.h needs on kernels
 * without bpf_task_pt_regs() (before 5.15). sys_enter is handed exactly that
 * pointer; user space runs this once, makes one system call and reads the
 * offset. It depends on the kernel's build (THREAD_SIZE with KASAN, FRED's
 * padding), so it is measured, never assumed.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile __u32 target_tgid = 0;
__u64 offset = 0;

SEC("raw_tp/sys_enter")
int BPF_PROG(measure_ptregs, struct pt_regs *regs, long id)
{
	struct task_struct *t;

	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid || offset)
		return 0;
	t = (struct task_struct *)bpf_get_current_task();
	offset = (__u64)regs - (__u64)BPF_CORE_READ(t, stack);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
