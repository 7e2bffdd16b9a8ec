/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A thread's user registers, where the walk of its user stack starts
 * (common/unwind.bpf.h), and the system call it is in.
 *
 * The user registers: a perf sample that interrupted user mode carries them;
 * everywhere else they are the ones saved at the top of the task's kernel
 * stack on entry to the kernel. bpf_task_pt_regs() finds them where the kernel
 * has it (5.15); before, they sit emd_ptregs_offset bytes above task->stack,
 * an offset user space measures at start (calibrate_ptregs_offset).
 */
#ifndef EBPF_METRICSD_USTACK_BPF_H
#define EBPF_METRICSD_USTACK_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "common/maps.bpf.h"
#include "common/ustack.h"

#ifndef PF_KTHREAD
#define PF_KTHREAD 0x00200000
#endif
#define EMD_PF_IO_WORKER 0x00000010

/* The saved user registers as the x86-64 ABI lays them out (struct pt_regs of
 * asm/ptrace.h, bpf_user_pt_regs_t): 21 words, the same on every kernel. Read
 * through this, not the kernel's struct, whose cs and ss became unions with
 * FRED (6.9): a perf program's context allows only whole-word loads. */
struct emd_user_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di,
	    orig_ax, ip, cs, flags, sp, ss;
};

const volatile __u32 emd_ptregs_offset = 0;

/* The user registers saved at the top of the current task's kernel stack. */
static __always_inline struct pt_regs *emd_task_user_regs(void)
{
	struct task_struct *t;
	void *stack;

	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		return (struct pt_regs *)bpf_task_pt_regs(
		    bpf_get_current_task_btf());
	t = (struct task_struct *)bpf_get_current_task();
	stack = BPF_CORE_READ(t, stack);
	if (!stack || !emd_ptregs_offset)
		return NULL;
	return (struct pt_regs *)(stack + emd_ptregs_offset);
}

/*
 * The system call the current task is in, with where it returns to, from
 * its saved user registers: a syscall entry saved the call's number in
 * orig_ax and left ip after the `syscall` instruction (0f 05). An exception
 * (a page fault) saves its error code there and the faulting ip; an interrupt
 * a negative vector. False when it is not in a system call (or past its
 * return, on the way back to user space), or stopped by a signal or a tracer
 * (TASK_STOPPED, TASK_TRACED: a stop, not the call's wait).
 */
#define EMD_TASK_STOPPED_OR_TRACED 0x0000000c
#define EMD_MAX_SYSCALL 1024
/* Whether site s is the call at user instruction and stack pointers ip, sp
 * with number nr. */
static __always_inline bool
emd_syscall_site_is(const struct emd_syscall_site *s, __u64 ip, __u64 sp,
		    __s64 nr)
{
	return s->ip == ip && s->sp == sp && s->nr == nr;
}

static __always_inline bool emd_syscall_site_here(struct emd_syscall_site *at,
						  unsigned int state)
{
	const struct pt_regs *saved;
	struct emd_user_regs r;
	__u16 insn = 0;

	if (state & EMD_TASK_STOPPED_OR_TRACED)
		return false;
	saved = emd_task_user_regs();
	if (!saved || bpf_probe_read_kernel(&r, sizeof(r), saved))
		return false;
	/* The entry stores -ENOSYS in ax, and the call's return value replaces
	 * it only when the call returns: the work done on the way back to user
	 * space (task work, a last fput) is not inside the call. */
	if ((r.cs & 3) != 3 || r.orig_ax >= EMD_MAX_SYSCALL ||
	    r.ax != (__u64)-38 /* -ENOSYS */)
		return false;
	if (bpf_probe_read_user(&insn, sizeof(insn), (void *)(r.ip - 2)) ||
	    insn != 0x050f)
		return false;
	at->ip = r.ip;
	at->sp = r.sp;
	at->nr = (__s32)r.orig_ax;
	return true;
}

#endif
