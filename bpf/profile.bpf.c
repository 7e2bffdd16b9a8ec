// SPDX-License-Identifier: GPL-2.0
/*
 * Where the time goes, as stacks:
 *  - on-CPU: a CPU-clock perf event in frequency mode on every CPU runs
 *    on_cpu_sample; each sample adds its period (ns of CPU time) to the
 *    interrupted thread's (kernel stack, user stack). With `unwind: cfi` the
 *    user stack is walked in the kernel with the tables the daemon compiles
 *    from each file's CFI (common/unwind.bpf.h: the sample tail-calls
 *    profile_sample_walk, which records it once the walk is done); else it
 *    is the frame-pointer walk;
 *  - off-CPU: at sched_switch a thread that blocks leaves the time in
 *    per-thread state; when it is switched in again after at least
 *    offcpu_min, its kernel stack is taken where it still waits. Its user
 *    stack: a thread blocked inside a system call returns to the same one,
 *    which with `unwind: cfi` is walked when the call returns (sys_exit), in
 *    the thread's own context and only for the long waits; where it blocked
 *    elsewhere (a page fault), or without `unwind: cfi`, it is walked by frame
 *    pointer when it blocks. A shorter wait costs one comparison more.
 * The system call a thread blocks in is recorded with its wait in both modes.
 * At each read, user space runs the task iterator profile_threads: every
 * thread's scheduler accounting (time on a CPU, time runnable) and the wait
 * it is in now, which windows ending then count up to then; a thread that
 * exits leaves its last accounting in thread_ends.
 * A wait that began before the batch it ends in (batch_begin_ns, set at each
 * read), or that ends while user space swaps the maps (the swap takes effect at
 * some moment of it), says when it began and ended (profile_key.began), for
 * user space to share its time among the windows it spans; a wait sent as a
 * record always does.
 * Stacks are kept once each by a 64-bit hash of their frames
 * (common/stacks.bpf.h); aggregates in the inner map that `counts_slot`
 * points to. User space
 * swaps that inner map for an empty one (the update waits for programs still
 * running with the old one) and reads the old one whole: nothing is lost
 * between reads. What cannot be kept is counted in `drops`.
 * A process is announced to user space (new_processes) the first time it is
 * seen, and again after it execs or maps more code (mmap, mprotect with
 * PROT_EXEC, seen at sys_exit where that is attached), so that its mappings are
 * read while it lives: a process that exits before the next read is still
 * symbolized.
 * The off-CPU state machine is common/offcpu.bpf.h, as offcpu_time's.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/offcpu.bpf.h"
#include "common/read.bpf.h"
#include "common/stacks.bpf.h"
#include "common/unwind.bpf.h"
#include "common/ustack.bpf.h"
#include "profile.h"

#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000

/* Set by user space before load. */
const volatile __u8 on_cpu_on = 1;
const volatile __u8 off_cpu_on = 1;
const volatile __u64 offcpu_min_ns = 1000000;
const volatile __u32 nr_workloads = 0; /* 0: every workload */
/* `unwind: cfi`: user stacks are walked with the daemon's unwind tables. */
const volatile __u8 unwind_cfi = 0;
/* When the batch the aggregates go to began (monotonic ns), and whether the
 * maps are being swapped: set by user space at each read, batch_begin_ns and
 * then batch_swapping before it swaps the aggregate maps, batch_swapping
 * cleared once the swap has taken effect. */
volatile __u64 batch_begin_ns = 0;
volatile __u64 batch_swapping = 0;

/* Two aggregate maps, one of them in counts_slot at a time. Preallocated:
 * an inner map's flags must match the slot's template on every kernel. */
struct counts_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct profile_key);
	__type(value, struct profile_value);
} counts_a SEC(".maps"), counts_b SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct counts_map);
} counts_slot SEC(".maps") = {
    .values = {[0] = &counts_a},
};

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, PROFILE_MAX_WORKLOADS);
	__type(key, __u32);
	__type(value, __u32);
} workloads SEC(".maps");

/* Processes announced already; an evicted one is announced again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct profile_announced);
} announced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} new_processes SEC(".maps");

EMD_DROPS_MAP(PROFILE_DROP__COUNT);

/* The last accounting of threads that exited since the last read, by thread
 * id: read and emptied by user space at each cut. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct profile_thread);
} thread_ends SEC(".maps");

/* Bumped after announce_again marks a process: a sample walk's memo that its
 * process was announced (announce_memoized) holds while it stays. */
__u64 announce_gen = 0;

/* Tells user space about process tgid unless it knows it already: the first
 * time it is seen, and again after it exec'd or mapped more code (at most every
 * PROFILE_REANNOUNCE_NS), for its mappings to be read again. True where it was
 * known and nothing asked for it again. */
static __always_inline bool announce(__u32 tgid)
{
	struct profile_announcement a = {.tgid = tgid};
	struct profile_announced now = {};
	struct profile_announced *known;

	known = bpf_map_lookup_elem(&announced, &tgid);
	if (known && !known->again)
		return true; /* the common case: no clock read */
	now.at = bpf_ktime_get_ns();
	if (known && now.at - known->at < PROFILE_REANNOUNCE_NS)
		return false;
	a.again = known != NULL;
	if (bpf_ringbuf_output(&new_processes, &a, sizeof(a), 0)) {
		emd_count_drop(&drops, PROFILE_DROP_ANNOUNCE);
		return false;
	}
	bpf_map_update_elem(&announced, &tgid, &now, BPF_ANY);
	return false;
}

/* Process tgid exec'd (at 0: at once) or mapped more code: announce it again
 * when next seen. */
static __always_inline void announce_again(__u32 tgid, bool at_once)
{
	struct profile_announced *known =
	    bpf_map_lookup_elem(&announced, &tgid);

	if (!known)
		return; /* not announced yet: it will be, whole */
	if (at_once)
		known->at = 0;
	if (known->again)
		return; /* asked already: no memo can hold since */
	known->again = 1;
	__sync_fetch_and_add(&announce_gen, 1);
}

/* Whether the current task belongs to one of the configured workloads. */
static __always_inline bool wanted(void)
{
	__u32 i;

	if (nr_workloads == 0)
		return true;
	for (i = 0; i < PROFILE_MAX_WORKLOADS; i++) {
		if (i >= nr_workloads)
			break;
		if (bpf_current_task_under_cgroup(&workloads, i) == 1)
			return true;
	}
	return false;
}

/* Adds count samples or waits of ns to key. For waits, began and ended say
 * when (else 0): one that began before the batch of the map it goes to, or
 * ends while the maps are swapped, keeps when it began in its key (a thread
 * has one such wait at a time) and when it ended in its value. The map is
 * looked up before the swap is: a wait that finds the old map and no swap
 * ended before the batch did. */
static __always_inline void add_n(struct profile_key *key, __u64 count,
				  __u64 ns, __u64 began, __u64 ended)
{
	static const struct profile_value zero = {};
	struct profile_value *v;
	__u32 slot = 0;
	void *counts;

	counts = bpf_map_lookup_elem(&counts_slot, &slot);
	if (!counts)
		return;
	key->began =
	    began && (batch_swapping || began < batch_begin_ns) ? began : 0;
	v = emd_lookup_or_init(counts, key, &zero, &drops,
			       PROFILE_DROP_COUNTS_FULL);
	if (!v)
		return;
	__sync_fetch_and_add(&v->count, count);
	__sync_fetch_and_add(&v->ns, ns);
	if (key->began)
		v->ended = ended; /* one wait, of one thread */
}

static __always_inline void add(struct profile_key *key, __u64 ns)
{
	add_n(key, 1, ns, 0, 0);
}

static __always_inline bool user_task(void)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();

	return !(BPF_CORE_READ(t, flags) & PF_KTHREAD);
}

/*
 * The walks: a sample (perf_event) or a wait at the return of its system call
 * (sys_exit, tp_btf or raw_tp) starts one and tail-calls the walker of its
 * program type, which adds the sample or the wait once the stack has ended.
 * Filled by user space after load (index 0: the walker).
 */
struct walkers {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sample_walkers SEC(".maps"), exit_walkers_btf SEC(".maps"),
    exit_walkers_raw SEC(".maps");

/* What a walk carries for its finish (emd_walk.caller). */
struct walk_caller {
	struct profile_key key;
	__u64 count, ns, began, ended;
};

/* A walk in slot `slot` is done: its sample or wait is added with the stack
 * it found. */
static __always_inline void walk_done(struct emd_walk *w, __u32 slot)
{
	struct walk_caller *c = (void *)w->caller;

	c->key.ustack = emd_walk_keep(w, slot);
	add_n(&c->key, c->count, c->ns, c->began, c->ended);
}

/* The finish of each slot's walks (EMD_WALK_RUN), the slot a constant. */
static __always_inline void sample_walk_done(void *ctx, struct emd_walk *w)
{
	walk_done(w, EMD_WALK_SLOT_SAMPLE);
}

static __always_inline void exit_walk_done(void *ctx, struct emd_walk *w)
{
	walk_done(w, EMD_WALK_SLOT_TASK);
}

/* Hands walk w, its caller filled, to `walkers`, or adds its sample or wait
 * at once where no walker runs (EMD_WALK_HAND_OFF) with `done`. */
#define WALK_ON(ctx, w, walkers, done)                                         \
	do {                                                                   \
		EMD_WALK_HAND_OFF(ctx, w, walkers);                            \
		done(ctx, w);                                                  \
	} while (0)

/* Whether sample ctx interrupted user mode. */
static __always_inline bool sample_in_user_mode(struct bpf_perf_event_data *ctx)
{
	const struct emd_user_regs *interrupted = (void *)&ctx->regs;

	return (interrupted->cs & 3) == 3;
}

/* announce() for the process of sample walk w, skipped while the walk's memo
 * says that this CPU's last sample of it found it announced, and nothing has
 * asked for a process again since (announce_gen). */
static __always_inline void announce_memoized(struct emd_walk *w, __u32 tgid)
{
	__u64 gen = *(volatile __u64 *)&announce_gen;

	if (w->memo_hit && w->memo_announced == gen + 1)
		return;
	if (announce(tgid) && w->memo_tgid == tgid)
		w->memo_announced = gen + 1;
}

/* Starts the walk of a sample's user stack: from the interrupted registers
 * when it interrupted user mode (whole-word loads from the context, which the
 * verifier rewrites), else from those saved at the top of the task's kernel
 * stack. */
static __always_inline struct emd_walk *
sample_walk_begin(struct bpf_perf_event_data *ctx)
{
	const struct emd_user_regs *interrupted = (void *)&ctx->regs;

	if (!sample_in_user_mode(ctx))
		return emd_walk_begin_saved(EMD_WALK_SLOT_SAMPLE);
	return emd_walk_begin(EMD_WALK_SLOT_SAMPLE, interrupted->ip,
			      interrupted->sp, interrupted->bp,
			      interrupted->cs);
}

SEC("perf_event")
int profile_sample_walk(struct bpf_perf_event_data *ctx)
{
	EMD_WALK_RUN(ctx, EMD_WALK_SLOT_SAMPLE, &sample_walkers, sample_walk_done);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(profile_exit_walk_btf, struct pt_regs *regs, long ret)
{
	EMD_WALK_RUN(ctx, EMD_WALK_SLOT_TASK, &exit_walkers_btf, exit_walk_done);
	return 0;
}

SEC("raw_tp/sys_exit")
int BPF_PROG(profile_exit_walk_raw, struct pt_regs *regs, long ret)
{
	EMD_WALK_RUN(ctx, EMD_WALK_SLOT_TASK, &exit_walkers_raw, exit_walk_done);
	return 0;
}

EMD_UNWIND_EXIT_PROG(profile_walk_exit)

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct profile_key key = {};
	bool user;

	if (!on_cpu_on || (__u32)id == 0) /* the idle task is not work */
		return 0;
	if (!wanted())
		return 0;
	key.tgid = id >> 32;
	key.tid = (__u32)id;
	key.kind = PROFILE_ON_CPU;
	key.syscall = -1;
	if (emd_by_cgroup)
		key.cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	user = user_task();
	/* Interrupted in user mode: no kernel frames (bpf_get_stack would find
	 * none, at a cost of its own). */
	if (!sample_in_user_mode(ctx))
		key.kstack = emd_stack_take(ctx, 0, 0);
	if (unwind_cfi && user) {
		struct emd_walk *w = sample_walk_begin(ctx);
		struct walk_caller *c;

		if (w) {
			announce_memoized(w, key.tgid);
			c = (void *)w->caller;
			c->key = key;
			c->count = 1;
			c->ns = ctx->sample_period;
			c->began = 0;
			c->ended = 0;
			WALK_ON(ctx, w, &sample_walkers, sample_walk_done);
			return 0;
		}
	}
	if (user) {
		announce(key.tgid);
		key.ustack = emd_stack_take(ctx, 1, BPF_F_USER_STACK);
	}
	add(&key, ctx->sample_period);
	return 0;
}

/* Whether the user stacks of waits inside system calls are taken when the
 * call returns (`unwind: cfi`, with sys_exit attached). */
const volatile __u8 waits_at_sys_exit = 0;

/* Keeps waits of a system call that lost their user stack: by their kernel
 * stack alone, counted by why. */
static __always_inline void
keep_without_ustack(struct profile_key *key, const struct emd_syscall_wait *w,
		    __u32 loss)
{
	/* The reasons in the order of enum emd_syscall_wait_loss. */
	if (loss >= EMD_SYSCALL_WAIT_MISMATCH &&
	    loss <= EMD_SYSCALL_WAIT_KSTACK)
		emd_count_drop(&drops, PROFILE_DROP_SYSCALL_MISMATCH + loss -
					   EMD_SYSCALL_WAIT_MISMATCH);
	key->kstack = w->kstack;
	key->ustack = 0;
	key->syscall = w->site.nr;
	add_n(key, w->waits, w->ns, w->began, w->ended);
}

#define TASK_DEAD_STATE 0x0080

/* A thread's last switch-out (it is dead): its time on a CPU is final only
 * now, after the rest of its exit, so the counts its exit left in thread_ends
 * take it (the thread_end program runs before that rest). */
static __always_inline void thread_final(struct task_struct *prev)
{
	__u32 tid = BPF_CORE_READ(prev, pid);
	struct profile_thread *e = bpf_map_lookup_elem(&thread_ends, &tid);

	if (!e || e->start != BPF_CORE_READ(prev, start_time))
		return;
	e->on_cpu = BPF_CORE_READ(prev, se.sum_exec_runtime);
	if (bpf_core_field_exists(prev->sched_info.run_delay))
		e->run_delay = BPF_CORE_READ(prev, sched_info.run_delay);
}

static __always_inline int on_switch(void *ctx, bool preempt,
				     struct task_struct *prev,
				     struct task_struct *next,
				     unsigned int prev_state, bool raw)
{
	struct emd_syscall_wait flush;
	struct emd_offcpu *s;
	struct profile_key key = {};
	__u64 now, waited = 0, kstack;
	__u32 loss;

	if (!off_cpu_on)
		return 0;
	if (prev_state & TASK_DEAD_STATE)
		thread_final(prev);
	now = bpf_ktime_get_ns();

	/* prev, the current task, blocks: its stacks are where it waits. A task
	 * that exits switches out for good. Inside a system call its user stack
	 * stays as it is until the call returns, and is taken then (sys_exit),
	 * for a long wait only; elsewhere (a page fault) it can only be taken
	 * now, while it is current. Its kernel stack stays as it is until it
	 * runs again: with a BTF task pointer (tp_btf) it is taken then, and
	 * only for a wait of at least offcpu_min; raw_tp has no task pointer
	 * the helper accepts, so it takes it now. */
	if (emd_offcpu_blocks(preempt, prev_state) &&
	    !(EMD_READ(raw, prev, flags) & PF_EXITING) && wanted()) {
		s = emd_offcpu_block(prev, now, raw, &drops,
				     PROFILE_DROP_THREAD_STATE,
				     PROFILE_DROP_WAKE_MISSED);
		if (s) {
			bool user = !(EMD_READ(raw, prev, flags) & PF_KTHREAD);
			/* The system call it waits in, recorded with the
			 * wait in both modes (where it returns to: the
			 * CFI mode's sys_exit takes the stack there). */
			bool in_call =
			    user && emd_syscall_site_here(&s->site, prev_state);

			if (waits_at_sys_exit && user &&
			    (prev_state & EMD_TASK_STOPPED_OR_TRACED))
				emd_count_drop(&drops, PROFILE_DROP_STOPPED);
			if (waits_at_sys_exit && in_call) {
				if (raw)
					s->kstack = emd_stack_take(ctx, 2, 0);
			} else {
				emd_offcpu_keep_stacks(ctx, s, prev, raw, 2, 3);
			}
			if (user)
				announce(EMD_READ(raw, prev, tgid));
		}
	} else {
		emd_offcpu_runs(prev, raw, &drops, PROFILE_DROP_WAKE_MISSED);
	}

	s = emd_offcpu_wake(next, now, &waited, raw, &drops,
			    PROFILE_DROP_THREAD_STATE);
	if (!s || waited < offcpu_min_ns)
		return 0;
	key.tgid = EMD_READ(raw, next, tgid);
	key.tid = EMD_READ(raw, next, pid);
	key.kind = PROFILE_OFF_CPU;
	key.syscall = s->site.nr;
	if (emd_by_cgroup)
		key.cgroup = EMD_READ(raw, next, cgroups, dfl_cgrp, kn, id);
	BPF_CORE_READ_STR_INTO(&key.comm, next, comm);
	kstack = emd_offcpu_kstack(next, s, raw, 2);
	if (waits_at_sys_exit && s->site.nr >= 0) {
		/* In a system call: its user stack when it returns. */
		loss = emd_syscall_wait_add(s, now, waited, kstack, &flush);
		if (loss != EMD_SYSCALL_WAIT_KEPT)
			keep_without_ustack(&key, &flush, loss);
		return 0;
	}
	key.kstack = kstack;
	key.ustack = s->ustack;
	add_n(&key, 1, waited, now - waited, now);
	return 0;
}

/* The key of an off-CPU wait of the current thread, without its stacks. */
static __always_inline void current_wait_key(struct profile_key *key)
{
	__u64 id = bpf_get_current_pid_tgid();

	key->tgid = id >> 32;
	key->tid = (__u32)id;
	key->kind = PROFILE_OFF_CPU;
	if (emd_by_cgroup)
		key->cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(&key->comm, sizeof(key->comm));
}

/* The current task returns from a system call with user registers `regs`:
 * the long waits it had inside are added with the user stack it returns to,
 * walked with the unwind tables (else the frame-pointer walk of it). With
 * `unwind: cfi` this is also where the walk learns that a process's code may
 * have changed (common/unwind.bpf.h). */
static __always_inline void syscall_returns(void *ctx, struct pt_regs *regs,
					    long ret, bool raw)
{
	long nr = EMD_READ(raw, regs, orig_ax);
	__u32 loss = EMD_SYSCALL_WAIT_KEPT;
	struct emd_syscall_wait w;
	struct emd_user_regs r;
	struct profile_key key = {};
	/* Without off_cpu there is no off-CPU state (and no map for it): only
	 * the walk's watch runs here. */
	struct emd_offcpu *s = off_cpu_on ? emd_offcpu_current(raw) : NULL;
	struct emd_walk *walk;
	struct walk_caller *c;
	__u64 id = bpf_get_current_pid_tgid();

	if (unwind_cfi)
		emd_unwind_syscall_returns(regs, ret);
	if (nr == 9 || nr == 10) { /* mmap, mprotect: more code to read? */
		if ((EMD_READ(raw, regs, dx) & 0x4 /* PROT_EXEC */) && ret >= 0)
			announce_again(id >> 32, false);
	}
	/* Running, so not blocked: a stamp still there is a wait whose end was
	 * not seen (emd_offcpu_block). */
	if (s && s->blocked) {
		emd_count_drop(&drops, PROFILE_DROP_WAKE_MISSED);
		s->blocked = 0;
	}
	if (!s || !s->pending.waits)
		return;
	if (bpf_probe_read_kernel(&r, sizeof(r), regs))
		__builtin_memset(&r, 0, sizeof(r));
	if (!emd_syscall_wait_take(s, &r, &w, &loss))
		return;
	current_wait_key(&key);
	if (loss != EMD_SYSCALL_WAIT_KEPT) {
		keep_without_ustack(&key, &w, loss);
		return;
	}
	key.kstack = w.kstack;
	key.syscall = w.site.nr;
	walk = unwind_cfi
		   ? emd_walk_begin(EMD_WALK_SLOT_TASK, r.ip, r.sp, r.bp, r.cs)
		   : NULL;
	if (!walk) {
		/* Slot 5, its own: preempted here (7.2+), the sched_switch
		 * program that runs at the preemption takes its stacks in slots
		 * 2 and 3. */
		key.ustack = emd_stack_take(ctx, 5, BPF_F_USER_STACK);
		add_n(&key, w.waits, w.ns, w.began, w.ended);
		return;
	}
	c = (void *)walk->caller;
	c->key = key;
	c->count = w.waits;
	c->ns = w.ns;
	c->began = w.began;
	c->ended = w.ended;
	if (raw)
		WALK_ON(ctx, walk, &exit_walkers_raw, exit_walk_done);
	else
		WALK_ON(ctx, walk, &exit_walkers_btf, exit_walk_done);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(profile_sys_exit_btf, struct pt_regs *regs, long ret)
{
	syscall_returns(ctx, regs, ret, false);
	return 0;
}

SEC("raw_tp/sys_exit")
int BPF_PROG(profile_sys_exit_raw, struct pt_regs *regs, long ret)
{
	syscall_returns(ctx, regs, ret, true);
	return 0;
}

/* A thread that exits inside a system call (exit_group, or killed while it
 * waited) never returns from it: its pending waits are kept without a user
 * stack. */
static __always_inline void thread_exits(bool raw)
{
	struct emd_syscall_wait w;
	struct profile_key key = {};
	struct emd_offcpu *s = emd_offcpu_current(raw);

	if (!s || !s->pending.waits)
		return;
	w = s->pending;
	s->pending.waits = 0;
	current_wait_key(&key);
	keep_without_ustack(&key, &w, EMD_SYSCALL_WAIT_EXITED);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(profile_thread_exit_btf, struct task_struct *p)
{
	thread_exits(false);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int BPF_PROG(profile_thread_exit_raw, struct task_struct *p)
{
	thread_exits(true);
	return 0;
}

/* The scheduler's accounting of task t, seen at `now`. Profiled threads only:
 * with `workloads`, those of processes the profile has seen (announced). */
static __always_inline bool thread_accounting(struct task_struct *t, __u64 now,
					      struct profile_thread *r)
{
	r->tgid = BPF_CORE_READ(t, tgid);
	r->tid = BPF_CORE_READ(t, pid);
	r->kernel = !!(BPF_CORE_READ(t, flags) & PF_KTHREAD);
	if (nr_workloads &&
	    (r->kernel || !bpf_map_lookup_elem(&announced, &r->tgid)))
		return false;
	r->start = BPF_CORE_READ(t, start_time);
	r->on_cpu = BPF_CORE_READ(t, se.sum_exec_runtime);
	if (bpf_core_field_exists(t->sched_info.run_delay))
		r->run_delay = BPF_CORE_READ(t, sched_info.run_delay);
	r->now = now;
	r->syscall = -1;
	if (emd_by_cgroup)
		r->cgroup = BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
	BPF_CORE_READ_STR_INTO(&r->comm, t, comm);
	return true;
}

/*
 * Every thread of the host as it is now, for user space to read at each cut
 * (bpf_iter): its accounting, and the wait it is in, with the stacks known of
 * it so far (the kernel stack where it sleeps; its user stack where it was
 * taken when it blocked, else only where the call returns to).
 */
static __always_inline int threads_now(struct bpf_iter__task *ctx, bool raw)
{
	struct task_struct *t = ctx->task;
	struct profile_thread r = {};
	struct emd_offcpu *s;

	if (!t || !thread_accounting(t, bpf_ktime_get_ns(), &r))
		return 0;
	/* Asleep now: a stamp on a thread that runs (or was woken and waits
	 * for a CPU) is not a wait that goes on. */
	if (off_cpu_on && emd_task_state(t) != TASK_RUNNING) {
		s = emd_offcpu_of(t, false, raw, &drops, 0);
		if (s && s->blocked && r.now - s->blocked >= offcpu_min_ns) {
			r.blocked = s->blocked;
			r.syscall = s->site.nr;
			r.ip = s->site.ip;
			r.ustack = s->ustack;
			r.kstack = raw ? s->kstack : emd_stack_take_task(t, 4);
		}
	}
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}

SEC("iter/task")
int profile_threads_btf(struct bpf_iter__task *ctx)
{
	return threads_now(ctx, false);
}

SEC("iter/task")
int profile_threads_raw(struct bpf_iter__task *ctx)
{
	return threads_now(ctx, true);
}

/* A thread exits: its last accounting, for the time it ran since the last
 * read. Every kernel has raw_tp; no task state is used. */
SEC("raw_tp/sched_process_exit")
int BPF_PROG(profile_thread_end, struct task_struct *p)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	struct profile_thread r = {};

	if (!thread_accounting(t, bpf_ktime_get_ns(), &r))
		return 0;
	if (bpf_map_update_elem(&thread_ends, &r.tid, &r, BPF_ANY))
		emd_count_drop(&drops, PROFILE_DROP_THREAD_END);
	return 0;
}

#define SWITCH(preempt, prev, next, prev_state, raw)                           \
	on_switch(ctx, preempt, prev, next, prev_state, raw)

EMD_SCHED_SWITCH_PROGS(offcpu_switch, SWITCH)

/* A process that execs maps other files: announce it again when next seen,
 * for its mappings to be read again. */
SEC("raw_tp/sched_process_exec")
int BPF_PROG(profile_exec, struct task_struct *p)
{
	announce_again(BPF_CORE_READ(p, tgid), true);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
