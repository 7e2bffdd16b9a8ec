/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Where a thread is inside a system call (common/ustack.bpf.h). Shared by the
 * BPF side and user space.
 */
#ifndef EBPF_METRICSD_USTACK_H
#define EBPF_METRICSD_USTACK_H

/* Where a thread is inside a system call: the user instruction and stack
 * pointers it will return to, and the call. */
struct emd_syscall_site {
	__u64 ip;
	__u64 sp;
	__s32 nr; /* -1: not in a system call */
	__u32 pad;
};

#endif
