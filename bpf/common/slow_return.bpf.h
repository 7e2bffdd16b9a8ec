/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Slow events that end elsewhere than they start (a block request completed
 * in an interrupt, a connect established in a softirq): the task that starts
 * one is kept as its origin by the tracer's key (slow_origins), and the event
 * is sent with it if it proves slow.
 *
 * With emd_slow_unwind_cfi, an event whose starter waits for it inside a
 * system call (a synchronous read, a blocking connect()) is held until that
 * call returns and sent then, with the user stack it returns to walked in the
 * kernel (common/slow_walk.bpf.h), as syscall_latency's are: the function
 * that called read() through libc is found, with or without frame pointers.
 *
 * - At the start, a user task inside a system call is marked in
 *   emd_slow_calls with the call's return site (emd_syscall_site_here).
 * - At the end, a slow event whose starter is still marked with that site is
 *   held in emd_slow_held. Else it is sent at once with the frame-pointer
 *   stack kept from its start (EMD_SLOW_TAKEN_AT_START): its starter's call
 *   returned before it ended (io_uring, AIO, a non-blocking connect()), or it
 *   did not start inside a call (a page fault, a flusher thread).
 * - At sys_exit (emd_slow_call_returns), the task's mark goes, and its held
 *   event is sent: with the copy where the task returns to the site it
 *   started the event from (walked), else with the stack from its start
 * (counted: EMD_SLOW_RETURN_MISMATCH). A task that exits inside the call sends
 * it from sched_process_exit the same way (EMD_SLOW_RETURN_EXITED), and one
 *   that execs in it (execve reading the new program) from
 *   sched_process_exec (EMD_SLOW_RETURN_EXEC).
 *
 * The end never changes an entry in place (the starter's sys_exit may be
 * reading it on another CPU): it inserts a held entry where there is none
 * (BPF_NOEXIST), then looks at the mark again: gone, the starter returned
 * meanwhile, and whichever of the two deletes the held entry sends it. Every
 * taker (sys_exit, exit, exec, and user space, which sends events held longer
 * than it waits, with the stacks from their start) sends a held event only if
 * its own delete of it succeeded. A thread that execs from another thread than
 * the leader takes the leader's id (de_thread): its mark and held event go
 * under its old id.
 *
 * Counts of the entries let sys_exit, which runs for every system call on the
 * host, skip the lookups while nothing is marked or held: emd_slow_marked,
 * emd_slow_holding (the BPF side's inserts less its deletes) and
 * emd_slow_swept (the held entries user space deleted; it alone writes it).
 */
#ifndef EBPF_METRICSD_SLOW_RETURN_BPF_H
#define EBPF_METRICSD_SLOW_RETURN_BPF_H

#include "common/slow_walk.bpf.h"

/* What a map update with BPF_NOEXIST returns, negated, where the key is
 * there already (a full map returns another error). */
#define EMD_EEXIST 17

/* Both sized by user space (1 when unused). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* thread id */
	__type(value, struct emd_syscall_site);
} emd_slow_calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32); /* thread id */
	__type(value, struct emd_slow_held);
} emd_slow_held SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EMD_SLOW_RETURN__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} emd_slow_return_drops SEC(".maps");

/*
 * Where a held event is copied before its taker deletes it: a slot for each
 * taking program (sys_exit, sched_process_exit, sched_process_exec). Since
 * 7.2 the system call tracepoints run their programs with preemption on
 * (migration off): a sys_exit program preempted between its copy and its
 * send would find a shared slot overwritten by an exit or exec on the same
 * CPU meanwhile (the event sent with another thread's data). A program
 * preempted on a CPU keeps itself from running there until it resumes (the
 * kernel counts that as a recursion miss), so one slot a program suffices
 * wherever tracepoints run preemptibly.
 */
#define EMD_SLOW_TAKEN_SYS_EXIT 0
#define EMD_SLOW_TAKEN_EXIT 1
#define EMD_SLOW_TAKEN_EXEC 2
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, struct emd_slow_held);
} emd_slow_taken SEC(".maps");

/* Entries of emd_slow_calls; of emd_slow_held, holding less swept. */
__u64 emd_slow_marked = 0;
__u64 emd_slow_holding = 0;
__u64 emd_slow_swept = 0;

/*
 * The start of an event that ends elsewhere, in the task that starts it: keeps
 * that task as its origin under `key` (drop reason `full_reason` when there is
 * no room), and marks the system call it is in (with emd_slow_unwind_cfi).
 */
static __always_inline void emd_slow_start(void *ctx, __u64 key,
					   void *drops_map, __u32 full_reason)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	bool user = !(BPF_CORE_READ(t, flags) & PF_KTHREAD);
	struct emd_slow_origin o = {};
	__u32 tid;
	long err;

	if (!emd_slow_threshold_ns)
		return;
	emd_slow_origin_here(ctx, &o, user);
	if (emd_slow_unwind_cfi && user &&
	    !(BPF_CORE_READ(t, flags) & PF_EXITING) &&
	    emd_syscall_site_here(&o.site, 0)) {
		/* The starter's own context: its sys_exit cannot run now, and
		 * a mark already there is this call's. */
		tid = o.tid;
		err = bpf_map_update_elem(&emd_slow_calls, &tid, &o.site,
					  BPF_NOEXIST);
		if (!err) {
			__sync_fetch_and_add(&emd_slow_marked, 1);
		} else if (err != -EMD_EEXIST) {
			emd_count_drop(&emd_slow_return_drops,
				       EMD_SLOW_RETURN_FULL);
			o.site.nr = -1;
		}
	}
	if (bpf_map_update_elem(&slow_origins, &key, &o, BPF_ANY))
		emd_count_drop(drops_map, full_reason);
}

/*
 * Holds a slow event of origin o (whose starter is inside the system call at
 * o->site) for the starter's return: false (the caller sends it now) when
 * another event of the call is held already, or there is no room (both
 * counted).
 */
static __always_inline bool
emd_slow_hold_origin(const struct emd_slow_origin *o, __u64 now,
		     __u64 latency_ns, __u32 slot, __u64 key, const char *label,
		     __u64 cgroup)
{
	struct emd_slow_held h = {};
	__u32 tid = o->tid;
	long err;

	h.origin = *o;
	h.ts = now;
	h.latency_ns = latency_ns;
	h.cgroup = cgroup;
	h.key = key;
	h.slot = slot;
	bpf_probe_read_kernel_str(h.label, sizeof(h.label), label);
	/* counted first: a sys_exit that finds the entry finds it counted */
	__sync_fetch_and_add(&emd_slow_holding, 1);
	err = bpf_map_update_elem(&emd_slow_held, &tid, &h, BPF_NOEXIST);
	if (!err)
		return true;
	__sync_fetch_and_add(&emd_slow_holding, (__u64)-1);
	/* another event of the call is held already, or the map is full: this
	 * one goes now */
	emd_count_drop(&emd_slow_return_drops, err == -EMD_EEXIST
						   ? EMD_SLOW_RETURN_SECOND
						   : EMD_SLOW_RETURN_FULL);
	return false;
}

/* Whether the event of origin o, slow, is held for its starter's return:
 * where the starter is still marked inside the call it started it in. */
static __always_inline bool emd_slow_hold(const struct emd_slow_origin *o,
					  __u64 now, __u64 latency_ns,
					  __u32 slot, __u64 key,
					  const char *label, __u64 cgroup)
{
	struct emd_syscall_site *mark;
	__u32 tid = o->tid;

	if (o->site.nr < 0)
		return false;
	mark = bpf_map_lookup_elem(&emd_slow_calls, &tid);
	if (!mark ||
	    !emd_syscall_site_is(mark, o->site.ip, o->site.sp, o->site.nr))
		return false; /* the call returned first */
	if (!emd_slow_hold_origin(o, now, latency_ns, slot, key, label, cgroup))
		return false;
	/* The starter returned meanwhile (its mark gone): sent now, unless its
	 * sys_exit took it first. */
	if (!bpf_map_lookup_elem(&emd_slow_calls, &tid) &&
	    !bpf_map_delete_elem(&emd_slow_held, &tid)) {
		__sync_fetch_and_add(&emd_slow_holding, (__u64)-1);
		return false;
	}
	return true;
}

/*
 * The end of the event started under `key`, after latency_ns: when it was
 * `counted` in histogram slot of latency_ns and is slow (labelled by event_key
 * and `label`; with `cgroup: true` in the series of `series_cgroup`, else of
 * the origin's cgroup), held for its starter's return or sent with its origin;
 * the origin is forgotten either way.
 */
static __always_inline void emd_slow_end(__u64 key, __u64 latency_ns,
					 bool counted, __u64 event_key,
					 const char *label, __u64 series_cgroup,
					 void *drops_map, __u32 rate_reason,
					 __u32 full_reason)
{
	struct emd_slow_origin *o;
	__u64 now, cgroup;
	__u32 slot;

	if (!emd_slow_threshold_ns)
		return;
	o = bpf_map_lookup_elem(&slow_origins, &key);
	if (!o)
		return;
	now = bpf_ktime_get_ns();
	if (counted && emd_slow(latency_ns, o->tgid) &&
	    emd_slow_admit(now, drops_map, rate_reason)) {
		slot = emd_seconds_slot(latency_ns);
		cgroup = emd_by_cgroup ? series_cgroup : o->cgroup;
		if (!emd_slow_hold(o, now, latency_ns, slot, event_key, label,
				   cgroup))
			emd_slow_send_origin(now, latency_ns, slot, event_key,
					     label, cgroup, o, drops_map,
					     full_reason);
	}
	bpf_map_delete_elem(&slow_origins, &key);
}

/* Takes thread tid's held event: a copy in the taker's slot of
 * emd_slow_taken, or NULL (none, or another taker deleted it first). */
static __always_inline struct emd_slow_held *emd_slow_take(__u32 tid,
							    __u32 slot)
{
	struct emd_slow_held *held, *copy;

	if (emd_slow_holding == emd_slow_swept)
		return NULL;
	held = bpf_map_lookup_elem(&emd_slow_held, &tid);
	if (!held)
		return NULL;
	copy = bpf_map_lookup_elem(&emd_slow_taken, &slot);
	if (!copy)
		return NULL;
	*copy = *held;
	if (bpf_map_delete_elem(&emd_slow_held, &tid))
		return NULL;
	__sync_fetch_and_add(&emd_slow_holding, (__u64)-1);
	return copy;
}

/* Thread tid leaves its system call: its mark goes. */
static __always_inline void emd_slow_unmark(__u32 tid)
{
	if (emd_slow_marked && bpf_map_lookup_elem(&emd_slow_calls, &tid) &&
	    !bpf_map_delete_elem(&emd_slow_calls, &tid))
		__sync_fetch_and_add(&emd_slow_marked, (__u64)-1);
}

/* Sends held event h with the stacks from its start, counted under `why`. */
static __always_inline void
emd_slow_send_held_origin(const struct emd_slow_held *h, __u32 why,
			  void *drops_map, __u32 full_reason)
{
	emd_count_drop(&emd_slow_return_drops, why);
	emd_slow_send_origin(h->ts, h->latency_ns, h->slot, h->key, h->label,
			     h->cgroup, &h->origin, drops_map, full_reason);
}

/* Sends held event h with the user stack the current thread returns to (user
 * registers `regs`), walked with the unwind tables by the walker of the
 * sys_exit hook kind `raw`. */
static __always_inline void
emd_slow_send_held_walked(void *ctx, const struct emd_slow_held *h,
			  const struct pt_regs *regs, void *drops_map,
			  __u32 full_reason, bool raw)
{
	struct emd_slow_walk_caller c = {};

	c.ts = h->ts;
	c.latency_ns = h->latency_ns;
	c.cgroup = h->cgroup;
	c.key = h->key;
	c.kstack = h->origin.kstack;
	c.tgid = h->origin.tgid;
	c.tid = h->origin.tid;
	c.slot = h->slot;
	__builtin_memcpy(c.comm, h->origin.comm, sizeof(c.comm));
	__builtin_memcpy(c.label, h->label, sizeof(c.label));
	emd_slow_walk(ctx, regs, &c, raw, drops_map, full_reason);
}

/*
 * The current thread returns from a system call (the tracepoint's hook kind
 * `raw`) to user registers `regs`, with return value ret: its held event, if
 * any, is sent with the user stack it returns to when it returns from the call
 * it started the event in. With the walk, this is also where it learns that a
 * process's code may have changed (common/unwind.bpf.h).
 */
static __always_inline void emd_slow_call_returns(void *ctx,
						  const struct pt_regs *regs,
						  long ret, void *drops_map,
						  __u32 full_reason, bool raw)
{
	const struct emd_user_regs *u = (const void *)regs;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct emd_slow_held *h;
	__u64 ip = 0, sp = 0, nr = 0;

	if (emd_slow_unwind_cfi)
		emd_unwind_syscall_returns(regs, ret);
	emd_slow_unmark(tid);
	h = emd_slow_take(tid, EMD_SLOW_TAKEN_SYS_EXIT);
	if (!h)
		return;
	bpf_probe_read_kernel(&ip, sizeof(ip), &u->ip);
	bpf_probe_read_kernel(&sp, sizeof(sp), &u->sp);
	bpf_probe_read_kernel(&nr, sizeof(nr), &u->orig_ax);
	if (emd_syscall_site_is(&h->origin.site, ip, sp, (__s64)nr))
		emd_slow_send_held_walked(ctx, h, regs, drops_map, full_reason,
					  raw);
	else
		emd_slow_send_held_origin(h, EMD_SLOW_RETURN_MISMATCH,
					  drops_map, full_reason);
}

/* Thread tid will not return from the call it is marked in to where it made
 * it (it exits, or execs): its held event is sent with the stacks from its
 * start, counted under `why`. */
static __always_inline void
emd_slow_call_ends(__u32 tid, __u32 why, __u32 slot, void *drops_map,
		   __u32 full_reason)
{
	struct emd_slow_held *h;

	emd_slow_unmark(tid);
	h = emd_slow_take(tid, slot);
	if (h)
		emd_slow_send_held_origin(h, why, drops_map, full_reason);
}

/*
 * The programs that send held events: name_sys_exit_btf, name_sys_exit_raw
 * (sys_exit), name_exit (sched_process_exit) and name_exec
 * (sched_process_exec), and the walkers they hand them to; the tracer's drops
 * map and reason for a full ring.
 */
#define EMD_SLOW_RETURN_PROGS(name, drops_map, full_reason)                    \
	EMD_SLOW_WALKERS(drops_map, full_reason)                               \
	SEC("tp_btf/sys_exit")                                                 \
	int BPF_PROG(name##_sys_exit_btf, struct pt_regs *regs, long ret)      \
	{                                                                      \
		emd_slow_call_returns(ctx, regs, ret, drops_map, full_reason,  \
				      false);                                  \
		return 0;                                                      \
	}                                                                      \
	SEC("raw_tp/sys_exit")                                                 \
	int BPF_PROG(name##_sys_exit_raw, struct pt_regs *regs, long ret)      \
	{                                                                      \
		emd_slow_call_returns(ctx, regs, ret, drops_map, full_reason,  \
				      true);                                   \
		return 0;                                                      \
	}                                                                      \
	SEC("raw_tp/sched_process_exit")                                       \
	int BPF_PROG(name##_exit, struct task_struct *p)                       \
	{                                                                      \
		emd_slow_call_ends((__u32)bpf_get_current_pid_tgid(),          \
				   EMD_SLOW_RETURN_EXITED,                     \
				   EMD_SLOW_TAKEN_EXIT, drops_map,             \
				   full_reason);                               \
		return 0;                                                      \
	}                                                                      \
	SEC("raw_tp/sched_process_exec")                                       \
	int BPF_PROG(name##_exec, struct task_struct *p, pid_t old_pid)        \
	{                                                                      \
		emd_slow_call_ends((__u32)old_pid, EMD_SLOW_RETURN_EXEC,       \
				   EMD_SLOW_TAKEN_EXEC, drops_map,             \
				   full_reason);                               \
		return 0;                                                      \
	}

#endif
