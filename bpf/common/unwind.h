/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The walk of user stacks in the kernel (common/unwind.bpf.h): the maps the
 * daemon fills and the walk reads, shared by the BPF side and user space.
 *
 * - emd_unwind_mappings, an LPM trie: each process's mappings of files, as
 *   blocks of (process, address prefix) -> (file id, load bias); a mapping
 *   that holds no code has file 0 (it is there so that an unmapping that
 *   ends in it, as a library's unloading does, is seen).
 * - emd_unwind_procs (the kernel's): the processes walks have met, with what
 *   identifies them (their mm, their leader's start) and a generation the
 *   kernel bumps when it sees their code unmapped or replaced.
 * - emd_unwind_settled (the daemon's): for each process it has read, the
 *   generation that read is of, and whether a read is under way. A walk uses
 *   a process's mappings only when both agree.
 * - emd_unwind_files: each file's state (table loading, loaded, refused).
 * - emd_unwind_pages, emd_unwind_rows, emd_unwind_rules: the tables
 *   (common/unwind_table.h).
 * - emd_unwind_wants, a ring: the processes a walk found unread or changed,
 *   and the files it waited for, for the daemon to read and load.
 * - emd_unwind_ends: walks by how they ended.
 * - emd_unwind_version: a number bumped after any change that can fail a
 *   process check that passed (the sample walk's memo of its last check
 *   holds while it stays); the daemon maps it.
 */
#ifndef EBPF_METRICSD_UNWIND_H
#define EBPF_METRICSD_UNWIND_H

#include "common/unwind_table.h"

/* Frames a walker program follows before it tail-calls itself; the kernel
 * allows 33 tail calls, so a walk can reach 170 frames, past the stack's
 * EMD_STACK_MAX_DEPTH. */
#define EMD_UNWIND_FRAMES_PER_PROG 5

/* Binary search steps over a page's rows (at most 1 << 16 of them). */
#define EMD_UNWIND_SEARCH_STEPS 17

/* Entries of a walking object's frame cache, for each of its walk slots: what
 * a frame's address resolved to (file, rule), kept per CPU across walks. */
#define EMD_UNWIND_CACHE_BITS 8
#define EMD_UNWIND_CACHE_SLOTS 2

struct emd_unwind_map_key {
	__u32 prefixlen; /* 32 + the bits of addr that count */
	__u32 tgid;	 /* big-endian, as the trie compares bytes */
	__u64 addr;	 /* big-endian */
};

struct emd_unwind_mapping {
	__u32 file; /* the file's id; 0: not code */
	__u32 pad;
	__u64 bias;	/* the file's address = the process's address - bias */
	__u64 off_bias; /* the offset in the file = the address - off_bias */
	__u64 start; /* the mapping's range (of which the block is a part): */
	__u64 end;   /* the next frame is often in it, and needs no lookup */
};

struct emd_unwind_proc {
	__u64 mm;    /* its mm_struct: a new one after exec */
	__u64 start; /* its leader's start_time: a reused tgid is another */
	__u64 exec;  /* its leader's self_exec_id: an exec that got the same mm
			address back is still another program */
	__u64 asked; /* when a walk last asked for it (bpf_ktime_get_ns) */
	__u32 gen;   /* bumped where its code may have changed */
	__u32 pad;
};

struct emd_unwind_settled {
	__u64 mm; /* the emd_unwind_proc mm, start and exec the read was for */
	__u64 start;
	__u64 exec;
	__u32 gen;     /* the emd_unwind_proc gen read before the mappings */
	__u32 reading; /* a read under way: any unmapping bumps the gen */
	__u64 epoch;   /* this settlement's number, given to no other process
			  over the daemon's life, and again to this one only
			  when a read found the same files at the same places:
			  what a walk learnt from the process's mappings holds
			  while it is the same (the frame cache) */
};

enum emd_unwind_file_state {
	EMD_UNWIND_FILE_LOADING = 0, /* its table is being built */
	EMD_UNWIND_FILE_LOADED = 1,
	EMD_UNWIND_FILE_REFUSED = 2, /* no table (no CFI, too large, ...) */
};

struct emd_unwind_file {
	__u32 state;	      /* enum emd_unwind_file_state */
	__u32 frame_pointers; /* its code keeps rbp as a frame pointer */
};

/* A request to the daemon: read process tgid's mappings (file 0), or load
 * file `file` first, a walk waits for it. */
struct emd_unwind_want {
	__u32 tgid;
	__u32 file;
	__u32 why; /* enum emd_unwind_want_why */
	__u32 pad;
};

enum emd_unwind_want_why {
	EMD_UNWIND_WANT_WALK = 0,   /* a walk found it unread, or an address in
				       no file it maps */
	EMD_UNWIND_WANT_MAPPED = 1, /* it mapped code: read it now, whenever it
				       was read last */
	EMD_UNWIND_WANT_EXITED = 2, /* its leader exited: forget it */
};

/* How a walk ended (emd_unwind_ends, a per-CPU array). */
enum emd_unwind_end {
	EMD_UNWIND_END_COMPLETE = 0,	/* the stack's own end */
	EMD_UNWIND_END_NOT_READ = 1,	/* the process's mappings not read
					   yet, or changed since */
	EMD_UNWIND_END_NO_MAPPING = 2,	/* an address in no file's code */
	EMD_UNWIND_END_NOT_LOADED = 3,	/* the file's table not loaded yet */
	EMD_UNWIND_END_NO_TABLE = 4,	/* the file has no table */
	EMD_UNWIND_END_NO_CFI = 5,	/* an address its table does not
					   cover, without frame pointers */
	EMD_UNWIND_END_UNSUPPORTED = 6, /* a rule the walk does not follow */
	EMD_UNWIND_END_UNREADABLE = 7,	/* stack memory not readable */
	EMD_UNWIND_END_DEPTH = 8,	/* deeper than EMD_STACK_MAX_DEPTH */
	EMD_UNWIND_END_BAD_FRAME = 9,	/* a frame below its callee, a zero
					   frame pointer: the walk went astray */
	EMD_UNWIND_END_NO_WALKER = 10,	/* the walker program could not run */
	EMD_UNWIND_END_PREEMPTED = 11,	/* another walk took its CPU's state */
	EMD_UNWIND_END_NO_USER = 12,	/* no user stack (a kernel thread,
					   an exiting task) */
	EMD_UNWIND_END__COUNT,
};

/* A stack cut before its end ends with this marker frame, the reason in its
 * low byte: an address no user code has. */
#define EMD_UNWIND_CUT_MARK 0xffffffffffffff00ULL

/* A frame the walk found in a file's code is kept as the file's id and the
 * offset in the file (bits 40..61 and 0..39, bit 63 set, bit 62 clear), so
 * that it is named from that file whatever the process maps later (a library
 * unloaded, the process gone). A frame in no file's code is its address. */
#define EMD_UNWIND_FILE_FRAME (1ULL << 63)
#define EMD_UNWIND_FILE_SHIFT 40
#define EMD_UNWIND_OFFSET_MASK ((1ULL << EMD_UNWIND_FILE_SHIFT) - 1)
/* File ids are below this. */
#define EMD_UNWIND_MAX_FILES (1U << 22)
#define emd_unwind_file_frame(ip) (((ip) >> 62) == 2)

#endif
