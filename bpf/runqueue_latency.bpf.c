// SPDX-License-Identifier: GPL-2.0
/*
 * Run-queue latency: from a task becoming runnable (sched_wakeup,
 * sched_wakeup_new, or preempted while still runnable at sched_switch) to it
 * being switched in. Each hook exists as tp_btf and raw_tp; per-task state is
 * in common/task_state.bpf.h.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/sched_switch.bpf.h"
#include "common/task_labels.bpf.h"
#include "common/task_state.bpf.h"
#include "runqueue_latency.h"

struct runq_task {
	__u64 enqueued; /* ns when it became runnable, 0 = not waiting */
};

EMD_DROPS_MAP(RUNQ_DROP__COUNT);
EMD_TASK_STATE(runq, struct runq_task)

EMD_TASK_HIST_MAPS(runq_hist);

static __always_inline int on_wakeup(struct task_struct *p, bool raw)
{
	struct runq_task *s =
	    runq_of(p, true, raw, &drops, RUNQ_DROP_TASK_STATE);

	if (s)
		s->enqueued = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_switch(bool preempt, struct task_struct *prev,
				     struct task_struct *next,
				     unsigned int prev_state, bool raw)
{
	struct emd_task_hist *h;
	struct runq_task *s;
	__u64 now = bpf_ktime_get_ns();

	/* prev stays on the run queue when it was preempted or is runnable. */
	if (preempt || prev_state == TASK_RUNNING) {
		s = runq_of(prev, true, raw, &drops, RUNQ_DROP_TASK_STATE);
		if (s)
			s->enqueued = now;
	}
	/* next's wait ends now. Only looked up: a task whose state could not be
	 * made when it began to wait was counted then. */
	s = runq_of(next, false, raw, &drops, RUNQ_DROP_TASK_STATE);
	if (!s || !s->enqueued)
		return 0;
	h = emd_task_hist_of(next, &runq_hist, &runq_hist_labelled, &drops,
			     RUNQ_DROP_MAP_FULL, raw);
	if (h)
		emd_hist_add_ns(h, now - s->enqueued);
	s->enqueued = 0;
	return 0;
}

#define WAKEUP(raw) on_wakeup(p, raw)

EMD_TP_PROGS(sched_wakeup, sched_wakeup, WAKEUP, struct task_struct *p)
EMD_TP_PROGS(sched_wakeup_new, sched_wakeup_new, WAKEUP, struct task_struct *p)
EMD_SCHED_SWITCH_PROGS(sched_switch, on_switch)

char LICENSE[] SEC("license") = "GPL";
