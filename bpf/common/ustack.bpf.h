/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Copying the top of the current thread's user stack with its user registers
 * (common/ustack.h), for the daemon to unwind with CFI. Every copy becomes a
 * ring record of its own, so copies are limited to emd_ustack_per_second over
 * all CPUs (what the limit refuses is counted), and everything that keeps a
 * copy from being made is counted in emd_ustack_drops by reason.
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

#include "common/budget.bpf.h"
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
const volatile __u32 emd_ustack_per_second = 0;

EMD_BUDGET_MAP(emd_ustack_budget);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_USTACK_DROP__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} emd_ustack_drops SEC(".maps");

static __always_inline void emd_ustack_count(__u32 reason)
{
	emd_count_drop(&emd_ustack_drops, reason);
}

/* Whether another copy fits this second's budget (counted when not). */
static __always_inline bool emd_ustack_admit(void)
{
	if (emd_budget_take(&emd_ustack_budget, emd_ustack_per_second,
			    bpf_ktime_get_ns()))
		return true;
	emd_ustack_count(EMD_USTACK_DROP_BUDGET);
	return false;
}

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

/* Whether the current task has a user stack of its own: not a kernel thread,
 * not an io_uring or vhost worker (their saved registers are zeros). */
static __always_inline bool emd_has_user_stack(void)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u32 flags = BPF_CORE_READ(t, flags);

	if (flags & PF_KTHREAD)
		return false;
	if (flags & EMD_PF_IO_WORKER) {
		emd_ustack_count(EMD_USTACK_DROP_WORKER);
		return false;
	}
	return true;
}

/* Fills u's registers from user registers r (a copy, or a perf context's);
 * false (counted) when they are not a 64-bit user thread's. */
static __always_inline bool emd_ustack_regs_of(struct emd_ustack *u,
					       const struct emd_user_regs *rp)
{
	const struct emd_user_regs r = *rp;

	if ((r.cs & 3) != 3 || !r.sp || !r.ip) {
		emd_ustack_count(r.ip ? EMD_USTACK_DROP_NO_REGS
				      : EMD_USTACK_DROP_WORKER);
		return false;
	}
	u->regs[0] = r.ax;
	u->regs[1] = r.dx;
	u->regs[2] = r.cx;
	u->regs[3] = r.bx;
	u->regs[4] = r.si;
	u->regs[5] = r.di;
	u->regs[6] = r.bp;
	u->regs[7] = r.sp;
	u->regs[8] = r.r8;
	u->regs[9] = r.r9;
	u->regs[10] = r.r10;
	u->regs[11] = r.r11;
	u->regs[12] = r.r12;
	u->regs[13] = r.r13;
	u->regs[14] = r.r14;
	u->regs[15] = r.r15;
	u->regs[16] = r.ip;
	return true;
}

/* The same from the user registers saved at `saved` in the kernel. */
static __always_inline bool emd_ustack_regs(struct emd_ustack *u,
					    const struct pt_regs *saved)
{
	struct emd_user_regs r;

	if (!saved || bpf_probe_read_kernel(&r, sizeof(r), saved)) {
		emd_ustack_count(EMD_USTACK_DROP_NO_REGS);
		return false;
	}
	return emd_ustack_regs_of(u, &r);
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

/* Copies the stack from the page of the stack pointer up, page by page, until
 * a page is not resident (bpf_probe_read_user never faults one in); the bytes
 * copied, 0 (counted) when none. */
static __always_inline __u32 emd_ustack_copy(struct emd_ustack *u)
{
	__u64 base = u->regs[EMD_UREG_SP] & ~((__u64)EMD_USTACK_PAGE - 1);
	__u32 i, n = 0;

	u->base = base;
	for (i = 0; i < EMD_USTACK_PAGES; i++) {
		if (bpf_probe_read_user(&u->data[i * EMD_USTACK_PAGE],
					EMD_USTACK_PAGE,
					(void *)(base + i * EMD_USTACK_PAGE)))
			break;
		n++;
	}
	u->len = n * EMD_USTACK_PAGE;
	if (!n)
		emd_ustack_count(EMD_USTACK_DROP_UNREADABLE);
	return u->len;
}

/*
 * Takes the current task's user stack into u: from `interrupted` (a perf
 * sample's registers) when they are user mode's, else from the task's saved
 * ones. False (counted) when there is none to take, or the budget is spent.
 */
static __always_inline bool emd_ustack_take(struct emd_ustack *u,
					    const struct pt_regs *interrupted)
{
	if (!emd_has_user_stack())
		return false;
	if (!emd_ustack_admit())
		return false;
	if (!emd_ustack_regs(u,
			     interrupted ? interrupted : emd_task_user_regs()))
		return false;
	return emd_ustack_copy(u) > 0;
}

/* How a record of len bytes wakes the reader of `ring`: only once the ring
 * is a quarter full, else the reader drains it on its own period. A reader
 * woken by every record runs right after it, on a CPU a sample has just
 * found busy: it takes that CPU from the sampled thread and moves the next
 * samples off it, so the samples would not be where the time goes. */
static __always_inline __u64 emd_ring_wakeup(void *ring, __u64 len)
{
	__u64 size = bpf_ringbuf_query(ring, BPF_RB_RING_SIZE);
	__u64 held = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);

	return held + len >= size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* Sends record rec, whose last member is an emd_ustack u, through `ring`:
 * what precedes u and the bytes of u actually copied. */
#define emd_ustack_send(ring, rec, u)                                          \
	({                                                                     \
		__u64 __len =                                                  \
		    (__u64)((void *)(u)->data - (void *)(rec)) + (u)->len;     \
		long __err;                                                    \
		if (__len > sizeof(*(rec)))                                    \
			__len = sizeof(*(rec));                                \
		__err = bpf_ringbuf_output(ring, rec, __len,                   \
					   emd_ring_wakeup(ring, __len));      \
		if (__err)                                                     \
			emd_ustack_count(EMD_USTACK_DROP_RING_FULL);           \
		__err == 0;                                                    \
	})

#endif
