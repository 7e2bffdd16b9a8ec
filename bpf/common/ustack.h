/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A copy of the top of a thread's user stack and its user registers, for the
 * daemon to unwind with the CFI of the code it runs (common/ustack.bpf.h; in
 * user space, the Unwinder). Shared by the BPF side and user space.
 */
#ifndef EBPF_METRICSD_USTACK_H
#define EBPF_METRICSD_USTACK_H

/* Registers in DWARF order for x86-64: rax, rdx, rcx, rbx, rsi, rdi, rbp,
 * rsp, r8 .. r15, rip. */
#define EMD_UREGS 17
#define EMD_UREG_SP 7
#define EMD_UREG_IP 16

/* Pages copied from the one that holds the stack pointer up. */
#define EMD_USTACK_PAGE 4096
#define EMD_USTACK_PAGES 4
#define EMD_USTACK_BYTES (EMD_USTACK_PAGES * EMD_USTACK_PAGE)

struct emd_ustack {
	__u64 regs[EMD_UREGS];
	__u64 base; /* user address of data[0]: the page of the stack pointer */
	__u32 len;  /* bytes of data copied (whole pages; 0: none readable) */
	__u32 pad;
	__u8 data[EMD_USTACK_BYTES];
};

/* Where a thread is inside a system call: the user instruction and stack
 * pointers it will return to, and the call. */
struct emd_syscall_site {
	__u64 ip;
	__u64 sp;
	__s32 nr; /* -1: not in a system call */
	__u32 pad;
};

/* Why no user stack was copied, or not whole: the per-CPU array
 * emd_ustack_drops. */
enum emd_ustack_drop_reason {
	EMD_USTACK_DROP_NO_REGS = 0, /* the user registers could not be read */
	EMD_USTACK_DROP_UNREADABLE =
	    1, /* not even the stack pointer's page was resident */
	EMD_USTACK_DROP_BUDGET = 2,    /* over the copies a second allowed */
	EMD_USTACK_DROP_RING_FULL = 3, /* no room in the ring to user space */
	EMD_USTACK_DROP_WORKER =
	    4, /* a thread with no user stack of its own (io_uring, vhost) */
	EMD_USTACK_DROP__COUNT,
};

#endif
