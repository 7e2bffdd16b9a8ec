/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The walk of a user stack in the kernel, from the thread's user registers,
 * with the unwind tables the daemon compiles from each file's CFI
 * (common/unwind.h, common/unwind_table.h). No stack bytes leave the kernel:
 * the walk's frames are kept as any stack is (common/stacks.bpf.h).
 *
 * A walk runs in a walker program that follows EMD_UNWIND_FRAMES_PER_PROG
 * frames and tail-calls itself until the stack ends; its state is per CPU,
 * one slot for walks in a task's own context (sys_exit) and one for perf
 * samples, which can interrupt those. The object that walks defines, for
 * each hook it walks from, a prog array with its walker at index 0 and the
 * finish: what it does with the stack (EMD_UNWIND_WALKER).
 *
 * On a kernel whose BPF programs can be preempted (PREEMPT_RT, preempt=full,
 * sys_exit from 7.2) a walk can be interrupted by another task's on the same
 * CPU. Each object starts task-context walks from one attached program only
 * (its sys_exit program; the walkers are tail-called, never attached), and
 * the kernel skips, and counts as a recursion miss, a program's run on a CPU
 * where its earlier run is still under way (6.1+, the kernels that preempt
 * them): so no other walk takes the slot before the walk's last program has
 * finished. Each program still reads the state into locals, follows its
 * frames, and writes back only if the state is still its own (a sequence
 * number), else the walk ends as EMD_UNWIND_END_PREEMPTED: a guard, counted,
 * should a kernel run one program twice at once on a CPU.
 */
#ifndef EBPF_METRICSD_UNWIND_BPF_H
#define EBPF_METRICSD_UNWIND_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "common/stacks.bpf.h"
#include "common/unwind.h"
#include "common/ustack.bpf.h"

/* The maps the daemon fills: made once by it and given to every object that
 * walks (each declares them at size 1; user space reuses its own). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct emd_unwind_map_key);
	__type(value, struct emd_unwind_mapping);
} emd_unwind_mappings SEC(".maps");

/* LRU: a process that exits before the daemon reads it leaves its record,
 * and the oldest go first; a record lost so is made again (a generation past
 * any the daemon settled, so it is read again). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_unwind_proc);
} emd_unwind_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_unwind_settled);
} emd_unwind_settled SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_unwind_file);
} emd_unwind_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, struct emd_unwind_page_key);
	__type(value, struct emd_unwind_page);
} emd_unwind_pages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_unwind_row_pair);
} emd_unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emd_unwind_rule);
} emd_unwind_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096); /* sized by user space */
} emd_unwind_wants SEC(".maps");

/* A number bumped after every change that can fail a process check that
 * passed, or change the epoch it finds: by the daemon after it settles or
 * forgets a process, by the kernel side after an unmapping it sees (the
 * kernel's own new records and LRU evictions change neither). The sample
 * walk's memo of its last process check holds while the number stays
 * (emd_walk_process_ok). The daemon maps it to bump it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} emd_unwind_version SEC(".maps");

static __always_inline __u64 *emd_unwind_version_at(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&emd_unwind_version, &zero);
}

static __always_inline void emd_unwind_version_bump(void)
{
	__u64 *v = emd_unwind_version_at();

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* The object's own frame cache: what an address of a process resolved to (its
 * file and the rule there), kept per CPU across walks, since the frames near a
 * thread's start recur in every sample and each costs a trie, file, page and
 * row lookup otherwise. An entry holds for one settlement of one process (its
 * epoch, emd_unwind_settled): a new read of the process (after an exec, an
 * unmapping, new code) leaves all of its entries stale at once. Each walk slot
 * has entries of its own, written only by its walks: an entry is written
 * address last and read whole or not at all (emd_unwind_cache_hit), should a
 * walk interrupt another of its slot on a CPU (see the top). A hit needs no
 * file state: a file's table is unloaded only once no settled process maps
 * it (ProcessManager: its references), and a settlement has a new epoch
 * unless the daemon's read found the same files at the same places. */
struct emd_unwind_cached {
	__u64 addr;	/* the address looked up (0: empty) */
	__u64 epoch;	/* the settlement it holds for */
	__u64 off_bias; /* its mapping's (emd_unwind_mapping) */
	__u32 file;
	__u8 file_fp;	/* the file keeps frame pointers */
	__u8 pad[3];
	/* The rule itself, not its index: a hit reads one entry, no more
	 * (kind EMD_UNWIND_NONE where no row covers addr). */
	struct emd_unwind_rule rule;
};

_Static_assert((EMD_UNWIND_CACHE_SLOTS & (EMD_UNWIND_CACHE_SLOTS - 1)) == 0,
	       "the slot is masked");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_UNWIND_CACHE_SLOTS << EMD_UNWIND_CACHE_BITS);
	__type(key, __u32);
	__type(value, struct emd_unwind_cached);
} emd_unwind_cache SEC(".maps");

/* The object's own: its walks by how they ended. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_UNWIND_END__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} emd_unwind_ends SEC(".maps");

/* Asks for a process at most this often (a walk that finds it unread asks;
 * the daemon needs a few milliseconds to read it). */
#define EMD_UNWIND_ASK_NS 5000000ULL

/* Walks of the sample slot that one memo serves (emd_walk_process_ok,
 * emd_walk_keep). */
#define EMD_WALK_MEMO_USES 16

#define EMD_WALK_SLOT_TASK 0
#define EMD_WALK_SLOT_SAMPLE 1
#define EMD_WALK_CALLER_BYTES 256

/* What tells a process apart: its mm, its leader's start time (a reused pid)
 * and exec count (an exec that got the same mm address back). */
struct emd_unwind_ident {
	__u64 mm, start, exec;
};

struct emd_walk {
	__u64 owner; /* bpf_get_current_pid_tgid() of the walking task */
	__u64 seq;   /* bumped by each program that takes the state */
	__u64 pc, sp, fp;
	__u64 epoch; /* the settlement of the process's mappings walked with */
	__u32 tgid;
	__u8 fp_known;	 /* fp holds the frame's rbp */
	__u8 activation; /* pc is where the thread was, not a return address */
	__u8 done;
	__u8 end; /* enum emd_unwind_end, once done */
	/* The sample slot's memo of its last process check that passed: the
	 * process (tgid, emd_unwind_ident), the version it was made under and
	 * the epoch it found; memo_hit when this walk's check was the memo's.
	 * memo_announced: the profile's memo that the same process was
	 * announced (announce_gen + 1; 0 when the memo is new). A memo serves
	 * EMD_WALK_MEMO_USES walks at most, then the check is made again: its
	 * lookups mark the process's records used in their LRU maps. */
	__u32 memo_tgid;
	__u8 memo_hit;
	__u8 memo_uses; /* hits since the check was made */
	struct emd_unwind_ident memo_id;
	__u64 memo_version, memo_epoch;
	__u64 memo_announced;
	/* The sample slot's last stack kept (emd_walk_keep): its hash and
	 * second hash, and the walks that found it since it was looked up. */
	__u64 memo_stack, memo_stack_check;
	__u32 memo_stack_uses;
	struct emd_stack stack;
	/* What the starter keeps for its finish (a profile key, a slow event's
	 * fields), read back by the finish. */
	__u8 caller[EMD_WALK_CALLER_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct emd_walk);
} emd_walks SEC(".maps");

static __always_inline void emd_unwind_count_end(__u32 end)
{
	emd_count_drop(&emd_unwind_ends, end);
}

/* Asks the daemon to read process tgid (file 0) or to load `file` first, or
 * to forget tgid: for a walk (EMD_UNWIND_WANT_WALK), at most every
 * EMD_UNWIND_ASK_NS for a process it has met (code of no file would ask at
 * every sample); else always. */
static __always_inline void emd_unwind_ask(__u32 tgid, __u32 file, __u32 why)
{
	bool walking = why == EMD_UNWIND_WANT_WALK;
	struct emd_unwind_proc *p =
	    bpf_map_lookup_elem(&emd_unwind_procs, &tgid);
	struct emd_unwind_want *want;
	__u64 now = bpf_ktime_get_ns();

	if (p && walking) {
		if (now - p->asked < EMD_UNWIND_ASK_NS)
			return;
		p->asked = now;
	}
	want = bpf_ringbuf_reserve(&emd_unwind_wants, sizeof(*want), 0);
	if (!want)
		return; /* the daemon has asks to read: this one comes again */
	want->tgid = tgid;
	want->file = file;
	want->why = why;
	want->pad = 0;
	bpf_ringbuf_submit(want, 0);
}

/* The current process's emd_unwind_ident. */
static __always_inline void emd_unwind_ident_now(struct emd_unwind_ident *id)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(t, group_leader);

	id->mm = (__u64)BPF_CORE_READ(t, mm);
	id->start = BPF_CORE_READ(leader, start_time);
	id->exec = BPF_CORE_READ(leader, self_exec_id);
}

/*
 * Whether the current process's mappings, as the daemon read them, hold now:
 * it is the process the daemon read (id), and nothing was seen to change its
 * code since. Else the walk cannot use them (end *end) and the daemon is
 * asked to read it.
 */
static __always_inline bool
emd_unwind_process_ok(__u32 tgid, const struct emd_unwind_ident *id, __u8 *end,
		      __u64 *epoch)
{
	struct emd_unwind_settled *s;
	struct emd_unwind_proc *p;
	__u64 mm = id->mm, start = id->start, exec = id->exec;

	if (!mm) {
		*end = EMD_UNWIND_END_NO_USER;
		return false;
	}
	p = bpf_map_lookup_elem(&emd_unwind_procs, &tgid);
	s = bpf_map_lookup_elem(&emd_unwind_settled, &tgid);
	if (!p || p->mm != mm || p->start != start || p->exec != exec) {
		/* Met for the first time, or another process (an exec, a reused
		 * tgid), or its record was evicted: a generation of its own,
		 * which no read settled. */
		struct emd_unwind_proc fresh = {
		    .mm = mm, .start = start, .exec = exec};

		/* Past any generation a read in flight may settle (a read
		 * settles the generation it saw, or one less while reading). */
		fresh.gen = p ? p->gen + 2 : s ? s->gen + 2 : 0;
		bpf_map_update_elem(&emd_unwind_procs, &tgid, &fresh, BPF_ANY);
		emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_WALK);
		*end = EMD_UNWIND_END_NOT_READ;
		return false;
	}
	if (!s || s->mm != mm || s->start != start || s->exec != exec ||
	    s->gen != p->gen || s->reading) {
		emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_WALK);
		*end = EMD_UNWIND_END_NOT_READ;
		return false;
	}
	*epoch = s->epoch;
	return true;
}

/* The page of file `file`'s table that holds file address addr: false where
 * the table has none there (no rule). */
static __always_inline bool emd_unwind_page_of(__u32 file, __u64 addr,
					       __u32 *first, __u32 *count)
{
	struct emd_unwind_page_key pk = {
	    .file = file, .page = (__u32)(addr >> EMD_UNWIND_PAGE_BITS)};
	struct emd_unwind_page *page =
	    bpf_map_lookup_elem(&emd_unwind_pages, &pk);

	if (!page)
		return false;
	*first = page->first;
	*count = page->count;
	return true;
}

/* Row `idx` of the row array, as its 32 bits (lo in the low half, rule in the
 * high: little-endian), read as a scalar: a pointer into one half of the pair
 * would carry a variable offset the verifier tracks through every step of
 * every walk. False where the array has no such row. */
static __always_inline bool emd_unwind_row_at(__u32 idx, __u32 *row)
{
	__u32 key = idx / 2;
	__u64 *pair = bpf_map_lookup_elem(&emd_unwind_rows, &key);

	if (!pair)
		return false;
	*row = (__u32)(*pair >> ((idx & 1) * 32));
	return true;
}

/* The index of the rule of file address addr among the `count` rows from
 * `first` of its page: false where no row covers it (EMD_UNWIND_NONE). */
static __always_inline bool emd_unwind_rule_in(__u32 first, __u32 count,
					       __u64 addr, __u32 *index)
{
	__u32 lo = (__u32)(addr & ((1ULL << EMD_UNWIND_PAGE_BITS) - 1));
	__u32 l = 0, h = count, i, mid, row = 0;

	/* The first row above lo: the one before it is lo's. */
	for (i = 0; i < EMD_UNWIND_SEARCH_STEPS; i++) {
		if (l >= h)
			break;
		mid = l + (h - l) / 2;
		if (!emd_unwind_row_at(first + mid, &row))
			return false;
		if ((row & 0xffff) <= lo)
			l = mid + 1;
		else
			h = mid;
	}
	if (l == 0)
		return false;
	if (!emd_unwind_row_at(first + l - 1, &row))
		return false;
	*index = row >> 16;
	return true;
}

/* Keeps the compiler from moving loads and stores across it: what a program
 * that interrupts another on its CPU sees is then in program order. */
#define emd_barrier() asm volatile("" ::: "memory")

/* Whether frame cache entry c holds address addr in settlement epoch: *out
 * its copy, taken whole (an entry rewritten meanwhile, by a walk that
 * interrupted this one on its CPU, has another address or none: a miss). */
static __always_inline bool emd_unwind_cache_hit(struct emd_unwind_cached *c,
						 __u64 addr, __u64 epoch,
						 struct emd_unwind_cached *out)
{
	if (c->addr != addr || c->epoch != epoch)
		return false;
	*out = *c;
	emd_barrier();
	return c->addr == addr && c->epoch == epoch;
}

/* Rule `index`: false where the array has none. */
static __always_inline bool emd_unwind_rule(__u32 index,
					    struct emd_unwind_rule *out)
{
	struct emd_unwind_rule *rule =
	    bpf_map_lookup_elem(&emd_unwind_rules, &index);

	if (!rule)
		return false;
	*out = *rule;
	return true;
}

/* The frame cache's entry for address addr of walk slot `slot` in the
 * settlement `epoch` (emd_unwind_cache): where it would be kept. */
static __always_inline struct emd_unwind_cached *
emd_unwind_cache_entry(__u32 slot, __u64 addr, __u64 epoch)
{
	__u32 at = (__u32)(((addr ^ (epoch << 24)) * 0x9e3779b97f4a7c15ULL) >>
			   (64 - EMD_UNWIND_CACHE_BITS));

	at |= (slot & (EMD_UNWIND_CACHE_SLOTS - 1)) << EMD_UNWIND_CACHE_BITS;
	return bpf_map_lookup_elem(&emd_unwind_cache, &at);
}

/* A frame kept by file: file `file`, offset `offset` (common/unwind.h). */
static __always_inline __u64 emd_unwind_file_ip(__u32 file, __u64 offset)
{
	return EMD_UNWIND_FILE_FRAME | ((__u64)file << EMD_UNWIND_FILE_SHIFT) |
	       (offset & EMD_UNWIND_OFFSET_MASK);
}

/* The walk's registers while a program follows its frames: `base` frames
 * were recorded before it, `nr` by it (in its own ips). */
struct emd_walk_regs {
	__u64 pc, sp, fp;
	__u8 fp_known, activation, done, end;
	__u32 base, nr;
	__u64 epoch; /* the walk's (emd_walk) */
	__u32 walk_slot;
	/* The mapping (of a loaded file) and the page of the last frame: the
	 * next frame is often in them, and needs no lookup (file 0: none). */
	__u64 map_start, map_end, bias, off_bias;
	__u32 file, file_fp;
	__u32 page_file, page, page_first, page_count;
};

/* The mapping the daemon wrote that holds address a of process tgid, or
 * NULL. */
static __always_inline struct emd_unwind_mapping *
emd_unwind_mapping_at(__u32 tgid, __u64 a)
{
	struct emd_unwind_map_key key = {.prefixlen = 32 + 64};

	key.tgid = bpf_htonl(tgid);
	key.addr = bpf_cpu_to_be64(a);
	return bpf_map_lookup_elem(&emd_unwind_mappings, &key);
}

/* The mapping of address `lookup` (the frame's `stored`) into r: false where
 * the walk ends there (done, end and *ip set), it being in no file's code, or
 * in a file without a loaded table. */
static __always_inline bool emd_walk_mapping(struct emd_walk_regs *r,
					     __u32 tgid, __u64 lookup,
					     __u64 stored, __u64 *ip)
{
	struct emd_unwind_mapping *m = emd_unwind_mapping_at(tgid, lookup);
	struct emd_unwind_file *f;
	__u32 file;

	if (!m || !m->file) {
		/* Code of no file (a JIT's), or mapped since the daemon read
		 * the process: asked again. */
		*ip = stored;
		emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_WALK);
		r->done = 1;
		r->end = EMD_UNWIND_END_NO_MAPPING;
		return false;
	}
	file = m->file;
	r->file = 0;
	r->map_start = m->start;
	r->map_end = m->end;
	r->bias = m->bias;
	r->off_bias = m->off_bias;
	f = bpf_map_lookup_elem(&emd_unwind_files, &file);
	if (!f || f->state == EMD_UNWIND_FILE_LOADING) {
		*ip = emd_unwind_file_ip(file, stored - r->off_bias);
		emd_unwind_ask(tgid, file, EMD_UNWIND_WANT_WALK);
		r->done = 1;
		r->end = EMD_UNWIND_END_NOT_LOADED;
		return false;
	}
	if (f->state != EMD_UNWIND_FILE_LOADED) {
		*ip = emd_unwind_file_ip(file, stored - r->off_bias);
		r->done = 1;
		r->end = EMD_UNWIND_END_NO_TABLE;
		return false;
	}
	r->file = file;
	r->file_fp = f->frame_pointers;
	return true;
}

/* The index of the rule at file address addr of r's file (its page kept in r
 * for the next frame): false where no row covers it. */
static __always_inline bool emd_walk_rule_index(struct emd_walk_regs *r,
						__u64 addr, __u32 *index)
{
	__u32 file = r->file;

	if (r->page_file != file ||
	    r->page != (__u32)(addr >> EMD_UNWIND_PAGE_BITS)) {
		r->page_file = 0;
		if (emd_unwind_page_of(file, addr, &r->page_first,
				       &r->page_count)) {
			r->page_file = file;
			r->page = (__u32)(addr >> EMD_UNWIND_PAGE_BITS);
		}
	}
	if (r->page_file != file)
		return false;
	return emd_unwind_rule_in(r->page_first, r->page_count, addr, index);
}

/*
 * Records the frame at r->pc in *ip and finds its caller's registers. Sets
 * done and end where the stack ends (or is cut). Called from an unrolled loop
 * with ip at a constant place (5.10 takes no variable offset on the stack).
 */
static __always_inline void emd_walk_step(struct emd_walk_regs *r, __u32 tgid,
					  __u64 *ip)
{
	__u32 depth = r->base + r->nr;
	struct emd_unwind_cached *c, held = {};
	struct emd_unwind_rule rule = {};
	__u64 lookup, stored, off_bias, cfa, ra = 0, fp = 0, sp = 0;
	__u64 saved[2];
	__u32 file, index = 0;
	__u8 file_fp;

	/* The last place is the cut mark's: a stack deeper than that says so. */
	if (depth >= EMD_STACK_MAX_DEPTH - 1 ||
	    r->nr >= EMD_UNWIND_FRAMES_PER_PROG) {
		r->done = 1;
		r->end = EMD_UNWIND_END_DEPTH;
		return;
	}
	/* A return address is looked up one byte back (the call, not what
	 * follows it); stored as it is, user space does the same. A frame
	 * interrupted by a signal is stored one byte on, so that it too is
	 * looked up where it was. */
	lookup = r->activation ? r->pc : r->pc - 1;
	stored = (r->activation && depth > 0) ? r->pc + 1 : r->pc;
	r->nr++;

	c = emd_unwind_cache_entry(r->walk_slot, lookup, r->epoch);
	if (c && emd_unwind_cache_hit(c, lookup, r->epoch, &held)) {
		file = held.file;
		off_bias = held.off_bias;
		file_fp = held.file_fp;
		rule = held.rule;
	} else {
		if (!r->file || lookup < r->map_start ||
		    lookup >= r->map_end) {
			if (!emd_walk_mapping(r, tgid, lookup, stored, ip))
				return;
		}
		file = r->file;
		off_bias = r->off_bias;
		file_fp = r->file_fp;
		if (emd_walk_rule_index(r, lookup - r->bias, &index))
			emd_unwind_rule(index, &rule);
		if (c) {
			/* The address last: an entry is whole once it has it. */
			c->addr = 0;
			emd_barrier();
			c->epoch = r->epoch;
			c->off_bias = off_bias;
			c->file = file;
			c->file_fp = file_fp;
			c->rule = rule;
			emd_barrier();
			c->addr = lookup;
		}
	}
	/* In a file's code: the file and the offset in it. */
	*ip = emd_unwind_file_ip(file, stored - off_bias);
	switch (rule.kind) {
	case EMD_UNWIND_NONE:
		/* No CFI here: the frame pointer, where the file keeps one. */
		if (!file_fp || !r->fp_known || r->fp < r->sp) {
			r->done = 1;
			r->end = EMD_UNWIND_END_NO_CFI;
			return;
		}
		cfa = r->fp + 16;
		rule.ra_offset = -8;
		rule.fp = EMD_UNWIND_FP_AT_CFA;
		rule.fp_offset = -16;
		break;
	case EMD_UNWIND_CFA_RSP:
		cfa = r->sp + (__s64)rule.cfa_offset;
		break;
	case EMD_UNWIND_CFA_RBP:
		if (!r->fp_known) {
			r->done = 1;
			r->end = EMD_UNWIND_END_UNSUPPORTED;
			return;
		}
		cfa = r->fp + (__s64)rule.cfa_offset;
		break;
	case EMD_UNWIND_PLT:
		cfa = r->sp + (__s64)rule.cfa_offset +
		      ((r->pc & 15) >= rule.plt_threshold ? 8 : 0);
		break;
	case EMD_UNWIND_SIGNAL:
		/* The interrupted registers, in the ucontext on the stack. */
		if (bpf_probe_read_user(
			&sp, sizeof(sp),
			(void *)(r->sp + (__s64)rule.cfa_offset)) ||
		    bpf_probe_read_user(
			&ra, sizeof(ra),
			(void *)(r->sp + (__s64)rule.ra_offset)) ||
		    bpf_probe_read_user(
			&fp, sizeof(fp),
			(void *)(r->sp + (__s64)rule.fp_offset))) {
			r->done = 1;
			r->end = EMD_UNWIND_END_UNREADABLE;
			return;
		}
		r->pc = ra;
		r->sp = sp;
		r->fp = fp;
		r->fp_known = 1;
		r->activation = 1;
		return;
	case EMD_UNWIND_END:
		r->done = 1;
		r->end = EMD_UNWIND_END_COMPLETE;
		return;
	default:
		r->done = 1;
		r->end = EMD_UNWIND_END_UNSUPPORTED;
		return;
	}
	if (rule.fp == EMD_UNWIND_FP_AT_CFA &&
	    rule.fp_offset == rule.ra_offset - 8 &&
	    !bpf_probe_read_user(saved, sizeof(saved),
				 (void *)(cfa + (__s64)rule.fp_offset))) {
		/* The caller's rbp pushed next to the return address (at the
		 * function's entry, the common case): one read for both. */
		r->fp = saved[0];
		ra = saved[1];
	} else {
		if (bpf_probe_read_user(&ra, sizeof(ra),
					(void *)(cfa + (__s64)rule.ra_offset))) {
			r->done = 1;
			r->end = EMD_UNWIND_END_UNREADABLE;
			return;
		}
		if (rule.fp == EMD_UNWIND_FP_AT_CFA) {
			if (bpf_probe_read_user(
				&fp, sizeof(fp),
				(void *)(cfa + (__s64)rule.fp_offset)))
				r->fp_known = 0;
			else
				r->fp = fp;
		} else if (rule.fp == EMD_UNWIND_FP_UNDEFINED) {
			r->fp_known = 0;
		}
	}
	if (ra == 0) {
		/* An outermost frame that ends the chain with a zero return. */
		r->done = 1;
		r->end = EMD_UNWIND_END_COMPLETE;
		return;
	}
	if (cfa <= r->sp) {
		/* A caller's frame is above its callee's: this went astray. */
		r->done = 1;
		r->end = EMD_UNWIND_END_BAD_FRAME;
		return;
	}
	r->sp = cfa;
	r->pc = ra;
	r->activation = 0;
}

/* System calls that change what code a process maps (x86-64). */
#define EMD_NR_MMAP 9
#define EMD_NR_MPROTECT 10
#define EMD_NR_MUNMAP 11
#define EMD_NR_MREMAP 25
#define EMD_NR_SHMDT 67
#define EMD_PROT_EXEC 0x4
#define EMD_MAP_FIXED 0x10
#define EMD_MAP_ANONYMOUS 0x20

/* Whether address a of process tgid is in a mapping of a file the daemon
 * wrote. */
static __always_inline bool emd_unwind_mapped(__u32 tgid, __u64 a)
{
	return emd_unwind_mapping_at(tgid, a) != NULL;
}

/*
 * At the return of a system call (user registers `regs`, return value ret),
 * in every object that walks: a call that may have unmapped or replaced code
 * of a process the daemon has read (munmap, mremap, shmdt, mmap over a range
 * with MAP_FIXED) bumps the process's generation where an end of the range
 * was mapped code, or wherever the daemon is reading it (its new mappings are
 * not written yet): walks of it stop until it is read again. A file mapped
 * executable, or memory made executable, asks for it to be read (new code,
 * nothing the walk knows changed).
 */
static __always_inline void
emd_unwind_syscall_returns(const struct pt_regs *regs, long ret)
{
	const struct emd_user_regs *u = (const void *)regs;
	struct emd_unwind_settled *s;
	struct emd_unwind_proc *p;
	__u64 nr = 0, addr = 0, len = 0, prot = 0, flags = 0;
	__u32 tgid;
	bool unmaps = false;

	if (ret < 0 && ret > -4096)
		return; /* failed: nothing changed */
	bpf_probe_read_kernel(&nr, sizeof(nr), &u->orig_ax);
	if (nr != EMD_NR_MUNMAP && nr != EMD_NR_MREMAP && nr != EMD_NR_SHMDT &&
	    nr != EMD_NR_MMAP && nr != EMD_NR_MPROTECT)
		return;
	tgid = bpf_get_current_pid_tgid() >> 32;
	s = bpf_map_lookup_elem(&emd_unwind_settled, &tgid);
	if (!s)
		return; /* a process the daemon has not read */
	bpf_probe_read_kernel(&addr, sizeof(addr), &u->di);
	bpf_probe_read_kernel(&len, sizeof(len), &u->si);
	bpf_probe_read_kernel(&prot, sizeof(prot), &u->dx);
	bpf_probe_read_kernel(&flags, sizeof(flags), &u->r10);
	switch (nr) {
	case EMD_NR_MMAP:
		if ((prot & EMD_PROT_EXEC) && !(flags & EMD_MAP_ANONYMOUS))
			emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_MAPPED);
		unmaps = flags & EMD_MAP_FIXED;
		break;
	case EMD_NR_MPROTECT:
		if (prot & EMD_PROT_EXEC)
			emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_MAPPED);
		return;
	case EMD_NR_SHMDT:
		len = 1;
		unmaps = true;
		break;
	default:
		unmaps = true;
	}
	if (!unmaps || !len)
		return;
	if (!s->reading && !emd_unwind_mapped(tgid, addr) &&
	    !emd_unwind_mapped(tgid, addr + len - 1))
		return;
	p = bpf_map_lookup_elem(&emd_unwind_procs, &tgid);
	if (p)
		__sync_fetch_and_add(&p->gen, 1);
	emd_unwind_version_bump(); /* also where the record was evicted */
}

/* The current task exits: where it is a process's leader that walks have met,
 * the daemon forgets the process at once (its trie entries are many). */
static __always_inline void emd_unwind_task_exits(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	if ((__u32)id != tgid || !bpf_map_lookup_elem(&emd_unwind_procs, &tgid))
		return;
	emd_unwind_ask(tgid, 0, EMD_UNWIND_WANT_EXITED);
}

/* The program that tells the daemon of exits, in every object that walks. */
#define EMD_UNWIND_EXIT_PROG(name)                                             \
	SEC("raw_tp/sched_process_exit")                                       \
	int BPF_PROG(name, struct task_struct *p)                              \
	{                                                                      \
		emd_unwind_task_exits();                                       \
		return 0;                                                      \
	}

/*
 * emd_unwind_process_ok for walk w, in the sample slot through its memo: the
 * same process (tgid and emd_unwind_ident) under the same version passed the
 * check before, with the epoch it found: the two hash lookups are skipped.
 * Only the sample slot keeps one: its program runs in an interrupt, never
 * preempted, so a memo is never written in halves; the task slot's walks
 * (sys_exit) may be preempted.
 */
static __always_inline bool emd_walk_process_ok(struct emd_walk *w, __u32 slot)
{
	struct emd_unwind_ident id;
	__u64 version, *at;

	emd_unwind_ident_now(&id);
	if (slot != EMD_WALK_SLOT_SAMPLE)
		return emd_unwind_process_ok(w->tgid, &id, &w->end, &w->epoch);
	at = emd_unwind_version_at();
	if (!at)
		return emd_unwind_process_ok(w->tgid, &id, &w->end, &w->epoch);
	/* Read before the check it may memo: a change after it bumps it (x86
	 * keeps loads in order; the writers store, then bump). */
	version = *(volatile __u64 *)at;
	if (id.mm && w->memo_tgid == w->tgid && w->memo_id.mm == id.mm &&
	    w->memo_id.start == id.start && w->memo_id.exec == id.exec &&
	    w->memo_version == version && w->memo_uses < EMD_WALK_MEMO_USES) {
		w->memo_uses++;
		w->epoch = w->memo_epoch;
		w->memo_hit = 1;
		return true;
	}
	w->memo_tgid = 0;
	w->memo_uses = 0;
	w->memo_announced = 0;
	if (!emd_unwind_process_ok(w->tgid, &id, &w->end, &w->epoch))
		return false;
	w->memo_id = id;
	w->memo_version = version;
	w->memo_epoch = w->epoch;
	w->memo_tgid = w->tgid;
	return true;
}

/*
 * Starts a walk of the current task's user stack from its user registers
 * (ip, sp, bp and cs, as saved on entry or in a perf sample) in per-CPU slot
 * `slot`: the state for the caller to fill (caller[]) before it tail-calls
 * the walker, or NULL. A walk that cannot start is done already, with why:
 * a task without user registers (EMD_UNWIND_END_NO_USER), a process not read
 * (EMD_UNWIND_END_NOT_READ, the frame it is in recorded alone).
 */
static __always_inline struct emd_walk *
emd_walk_begin(__u32 slot, __u64 ip, __u64 sp, __u64 bp, __u64 cs)
{
	struct emd_walk *w = bpf_map_lookup_elem(&emd_walks, &slot);

	if (!w)
		return NULL;
	w->owner = bpf_get_current_pid_tgid();
	w->seq += 1;
	w->tgid = w->owner >> 32;
	w->stack.nr = 0;
	w->done = 0;
	w->memo_hit = 0;
	w->end = EMD_UNWIND_END_COMPLETE;
	w->fp_known = 1;
	w->activation = 1;
	w->pc = ip;
	w->sp = sp;
	w->fp = bp;
	if ((cs & 3) != 3 || !ip || !sp) {
		w->done = 1;
		w->end = EMD_UNWIND_END_NO_USER;
		return w;
	}
	w->epoch = 0;
	if (!emd_walk_process_ok(w, slot)) {
		w->stack.ips[0] = ip;
		w->stack.nr = 1;
		w->done = 1;
	}
	return w;
}

/* The same from the user registers saved on entry to the kernel. */
static __always_inline struct emd_walk *emd_walk_begin_saved(__u32 slot)
{
	const struct pt_regs *saved = emd_task_user_regs();
	struct emd_user_regs r = {};

	if (saved && bpf_probe_read_kernel(&r, sizeof(r), saved))
		r.cs = 0;
	return emd_walk_begin(slot, r.ip, r.sp, r.bp, r.cs);
}

_Static_assert(((EMD_STACK_MAX_DEPTH + 1) & EMD_STACK_MAX_DEPTH) == 0,
	       "a place in a stack is masked");

/* Place `at` of a stack's frames, tested below EMD_STACK_MAX_DEPTH by the
 * caller, as an index the verifier can bound: 5.10 keeps no bound across a
 * register's copies (the compiler may test one and index with another), so
 * the index is masked where it is used, out of the compiler's sight. */
static __always_inline __u32 emd_walk_place(__u32 at)
{
	asm volatile("" : "+r"(at));
	return at & EMD_STACK_MAX_DEPTH;
}

/* Writes the frames a program found (r, ips) into its walk w. */
static __always_inline void emd_walk_commit(struct emd_walk *w,
					    const struct emd_walk_regs *r,
					    const __u64 *ips)
{
	__u32 i, at;

#pragma unroll
	for (i = 0; i < EMD_UNWIND_FRAMES_PER_PROG; i++) {
		if (i >= r->nr)
			break;
		at = r->base + i;
		if (at < EMD_STACK_MAX_DEPTH)
			w->stack.ips[emd_walk_place(at)] = ips[i];
	}
	w->stack.nr = r->base + r->nr;
	w->pc = r->pc;
	w->sp = r->sp;
	w->fp = r->fp;
	w->fp_known = r->fp_known;
	w->activation = r->activation;
	w->done = r->done;
	w->end = r->end;
}

/* Ends walk w: counts how, and marks a stack cut before its end. */
static __always_inline void emd_walk_end(struct emd_walk *w)
{
	__u32 nr = w->stack.nr;

	emd_unwind_count_end(w->end);
	if (w->end != EMD_UNWIND_END_COMPLETE && nr < EMD_STACK_MAX_DEPTH) {
		w->stack.ips[emd_walk_place(nr)] = EMD_UNWIND_CUT_MARK | w->end;
		w->stack.nr = nr + 1;
	}
}

/*
 * Hands walk w, its caller filled, to the walker in prog array `walkers`
 * (index 0), which finishes it. Where no walker runs (the tail call fails), the
 * walk ends here: EMD_UNWIND_END_NO_WALKER, with the frame the thread is in,
 * for the caller to finish at once.
 */
#define EMD_WALK_HAND_OFF(ctx, w, walkers)                                     \
	do {                                                                   \
		bpf_tail_call(ctx, walkers, 0);                                \
		if (!(w)->done) {                                              \
			(w)->end = EMD_UNWIND_END_NO_WALKER;                   \
			if (!(w)->stack.nr) {                                  \
				(w)->stack.ips[0] = (w)->pc;                   \
				(w)->stack.nr = 1;                             \
			}                                                      \
		}                                                              \
		emd_walk_end(w);                                               \
	} while (0)

/* The hash of walk w's stack (in slot `slot`, a constant), kept
 * (common/stacks.bpf.h). The sample slot skips the lookup while its stack is
 * the one it kept last (a thread on a CPU sampled at the same place), at most
 * EMD_WALK_MEMO_USES times in a row: a lookup marks the stack used in the LRU
 * map, which keeps it from being evicted first. The daemon empties the map at
 * each read and keeps what it read: a stack a memo names, gone from the map
 * since, is still named; one evicted before the daemon read it (more stacks
 * between two reads than the map holds) is counted missing there. */
static __always_inline __u64 emd_walk_keep(struct emd_walk *w, __u32 slot)
{
	__u32 nr = w->stack.nr;
	__u64 h;

	if (nr > EMD_STACK_MAX_DEPTH)
		nr = EMD_STACK_MAX_DEPTH;
	if (slot != EMD_WALK_SLOT_SAMPLE || nr == 0)
		return emd_stack_keep(&w->stack, (long)nr * 8);
	h = emd_stack_hash(&w->stack, nr);
	if (h == w->memo_stack && w->stack.check == w->memo_stack_check &&
	    w->memo_stack_uses < EMD_WALK_MEMO_USES) {
		w->memo_stack_uses++;
		return h;
	}
	w->memo_stack = 0;
	h = emd_stack_keep_hashed(&w->stack, nr, h);
	if (h != EMD_STACK_NOT_KEPT && h != 0) {
		w->memo_stack_check = w->stack.check;
		w->memo_stack_uses = 0;
		w->memo_stack = h;
	}
	return h;
}

/*
 * One run of the walker in slot `slot`: follows up to
 * EMD_UNWIND_FRAMES_PER_PROG frames, then tail-calls itself through
 * `walkers` (index 0) or, once the stack has ended, calls finish(ctx, w).
 * The frames are found in locals and written back only if the slot is still
 * this walk's (see the top).
 */
#define EMD_WALK_RUN(ctx, slot, walkers, finish)                               \
	({                                                                     \
		__u32 __slot = (slot), __i;                                    \
		struct emd_walk *__w =                                         \
		    bpf_map_lookup_elem(&emd_walks, &__slot);                  \
		if (__w && __w->owner == bpf_get_current_pid_tgid()) {         \
			__u64 __seq = __w->seq + 1;                            \
			__u64 __ips[EMD_UNWIND_FRAMES_PER_PROG] = {};          \
			struct emd_walk_regs __r = {.pc = __w->pc,             \
						    .sp = __w->sp,             \
						    .fp = __w->fp,             \
						    .fp_known = __w->fp_known, \
						    .activation =              \
							__w->activation,       \
						    .done = __w->done,         \
						    .end = __w->end,           \
						    .base = __w->stack.nr,     \
						    .nr = 0,                   \
						    .epoch = __w->epoch,       \
						    .walk_slot = __slot};           \
			__w->seq = __seq;                                      \
			_Pragma("unroll") for (__i = 0;                        \
					       __i <                           \
					       EMD_UNWIND_FRAMES_PER_PROG;     \
					       __i++)                          \
			{                                                      \
				if (__r.done)                                  \
					break;                                 \
				emd_walk_step(&__r, __w->tgid, &__ips[__i]);   \
			}                                                      \
			if (__w->seq != __seq) {                               \
				emd_unwind_count_end(                          \
				    EMD_UNWIND_END_PREEMPTED);                 \
			} else {                                               \
				emd_walk_commit(__w, &__r, __ips);             \
				if (!__r.done)                                 \
					bpf_tail_call(ctx, walkers, 0);        \
				/* ended, or no walker to go on with */        \
				if (!__r.done)                                 \
					__w->end = EMD_UNWIND_END_NO_WALKER;   \
				emd_walk_end(__w);                             \
				finish(ctx, __w);                              \
			}                                                      \
		} else {                                                       \
			/* another walk took the slot: this one is lost */     \
			emd_unwind_count_end(EMD_UNWIND_END_PREEMPTED);        \
		}                                                              \
		0;                                                             \
	})

#endif
