/* SPDX-License-Identifier: GPL-2.0 */
/*
 * One sched_switch handler as the programs every kernel needs: sched_switch
 * passes the previous task's state since 5.18 (<name>_btf, <name>_raw);
 * before, the <name>_3arg_* programs read it from the task, which is what
 * the tracepoint itself reported then. User space loads the pair the
 * kernel's BTF shows the tracepoint's arguments for.
 */
#ifndef EBPF_METRICSD_SCHED_SWITCH_BPF_H
#define EBPF_METRICSD_SCHED_SWITCH_BPF_H

#include "common/read.bpf.h"

#define TASK_RUNNING 0

/* task_struct.state was renamed __state (and made unsigned int) in 5.14. */
struct task_struct___state_long {
	volatile long state;
} __attribute__((preserve_access_index));

/* The state of a task being switched out, as sched_switch reports it since 5.18. */
static __always_inline unsigned int emd_task_state(struct task_struct *t)
{
	struct task_struct___state_long *old = (void *)t;

	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return (unsigned int)BPF_CORE_READ(old, state);
}

/*
 * The four programs of one handler: `call(preempt, prev, next, prev_state,
 * raw)` is a function or macro (a macro may use the program's ctx).
 */
#define EMD_SCHED_SWITCH_PROGS(name, call)                                     \
	SEC("tp_btf/sched_switch")                                             \
	int BPF_PROG(name##_btf, bool preempt, struct task_struct *prev,       \
		     struct task_struct *next, unsigned int prev_state)        \
	{                                                                      \
		return call(preempt, prev, next, prev_state, false);           \
	}                                                                      \
	SEC("raw_tp/sched_switch")                                             \
	int BPF_PROG(name##_raw, bool preempt, struct task_struct *prev,       \
		     struct task_struct *next, unsigned int prev_state)        \
	{                                                                      \
		return call(preempt, prev, next, prev_state, true);            \
	}                                                                      \
	SEC("tp_btf/sched_switch")                                             \
	int BPF_PROG(name##_3arg_btf, bool preempt, struct task_struct *prev,  \
		     struct task_struct *next)                                 \
	{                                                                      \
		return call(preempt, prev, next, emd_task_state(prev), false); \
	}                                                                      \
	SEC("raw_tp/sched_switch")                                             \
	int BPF_PROG(name##_3arg_raw, bool preempt, struct task_struct *prev,  \
		     struct task_struct *next)                                 \
	{                                                                      \
		return call(preempt, prev, next, emd_task_state(prev), true);  \
	}

#endif
