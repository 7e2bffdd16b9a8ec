/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Unwind tables: each executable file's CFI compiled by the daemon into rules
 * the kernel side follows to walk a user stack (profile/unwind_table.h builds
 * them). Shared by the BPF side and user space.
 *
 * A file's addresses (its link-time virtual addresses) are cut into pages of
 * 64 KiB. Each page of a file that has CFI holds sorted rows, one where a
 * rule starts: the 16 low bits of its address and the rule's index. The row
 * for an address is the last one at or below it; an address below a page's
 * first row, or in a page with no rows, has no rule (EMD_UNWIND_NONE). Rules
 * are few (the same stack adjustments recur in every file) and kept once for
 * all files.
 */
#ifndef EBPF_METRICSD_UNWIND_TABLE_H
#define EBPF_METRICSD_UNWIND_TABLE_H

#define EMD_UNWIND_PAGE_BITS 16

/* How the canonical frame address (CFA: the stack pointer before the call
 * that made this frame) is found, or why it is not. */
enum emd_unwind_kind {
	/* No CFI covers the address (between functions, hand-written code). */
	EMD_UNWIND_NONE = 0,
	/* CFA = rsp + cfa_offset. */
	EMD_UNWIND_CFA_RSP = 1,
	/* CFA = rbp + cfa_offset. */
	EMD_UNWIND_CFA_RBP = 2,
	/* A PLT entry: CFA = rsp + cfa_offset, plus 8 where the low four bits
	 * of the instruction pointer are at least plt_threshold (past the
	 * entry's push). */
	EMD_UNWIND_PLT = 3,
	/* A signal frame (the C library's return trampoline): the interrupted
	 * rsp, rip and rbp are read at rsp + cfa_offset, ra_offset and
	 * fp_offset; rip is where the thread was, not a return address. */
	EMD_UNWIND_SIGNAL = 4,
	/* The return address is undefined: the stack's own end (_start, a
	 * thread's first frame). */
	EMD_UNWIND_END = 5,
	/* A rule the walk does not follow (a DWARF expression, a return
	 * address kept in a register): the stack ends here, counted. */
	EMD_UNWIND_UNSUPPORTED = 6,
};

/* Where the caller's rbp is. */
enum emd_unwind_fp {
	EMD_UNWIND_FP_SAME = 0,	     /* unchanged by this frame */
	EMD_UNWIND_FP_AT_CFA = 1,    /* saved at CFA + fp_offset */
	EMD_UNWIND_FP_UNDEFINED = 2, /* not recoverable */
};

struct emd_unwind_rule {
	__u8 kind;	    /* enum emd_unwind_kind */
	__u8 fp;	    /* enum emd_unwind_fp */
	__u8 plt_threshold; /* EMD_UNWIND_PLT */
	__u8 pad;
	__s32 cfa_offset;
	__s32 fp_offset;
	__s32 ra_offset; /* the return address at CFA + ra_offset */
};

struct emd_unwind_row {
	__u16 lo;   /* the low 16 bits of the address the rule starts at */
	__u16 rule; /* index into the rules */
};

/* The row array's element: two rows, row i in element i / 2 at i % 2 (the
 * kernel gives each array element 8 bytes, so one row each would take as
 * much again). A table's first row is even. */
struct emd_unwind_row_pair {
	struct emd_unwind_row row[2];
};

/* A page of a file's table: its rows in the row array. */
struct emd_unwind_page_key {
	__u32 file; /* the file's id, given by the daemon */
	__u32 page; /* the address >> EMD_UNWIND_PAGE_BITS */
};
struct emd_unwind_page {
	__u32 first; /* index of its first row */
	__u32 count; /* rows, at least 1, at most 1 << EMD_UNWIND_PAGE_BITS */
};

#endif
