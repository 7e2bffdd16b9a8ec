/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Layout shared by scheduler.bpf.c and the two tracers that use it,
 * runqueue_latency and offcpu_time (src/tracers/sched_object.cpp).
 */
#ifndef EBPF_METRICSD_SCHEDULER_H
#define EBPF_METRICSD_SCHEDULER_H

#include "common/log2_slot.h"

/* Histogram slots: powers of two of seconds (common/log2_slot.h). */
#define SCHED_SLOTS EMD_HIST_SLOTS

struct sched_hist {
	__u64 slots[SCHED_SLOTS];
	__u64 sum; /* ns */
};

/* Distinct (cgroup, comm) label sets per labelled histogram, unless user space
 * sizes the map otherwise (label_map_entries). */
#define SCHED_MAX_LABEL_SETS 4096

/* Key of the labelled histograms; fields of labels that are off stay 0. */
struct sched_key {
	__u64 cgroup_id;
	char comm[16];
};

enum sched_switch_kind {
	SCHED_SWITCH_VOLUNTARY = 0,
	SCHED_SWITCH_INVOLUNTARY = 1,
	SCHED_SWITCH__COUNT,
};

enum sched_drop_reason {
	SCHED_DROP_TASK_STATE = 0, /* task storage / pid map could not hold a task */
	SCHED_DROP_RUNQ_LABELS = 1, /* runq labelled histogram map full */
	SCHED_DROP_OFFCPU_LABELS = 2, /* offcpu labelled histogram map full */
	SCHED_DROP_SLOW_LIMITED = 3, /* offcpu slow waits over max_per_second */
	SCHED_DROP_SLOW_RING_FULL = 4, /* offcpu slow waits finding the ring full */
	SCHED_DROP__COUNT,
};

/* Set by user space in .bss before the object loads, never changed after: one object
 * serves both tracers. */
struct sched_config {
	__u8 runq_on;
	__u8 runq_by_cgroup;
	__u8 runq_by_comm;
	__u8 offcpu_on;
	__u8 offcpu_by_cgroup;
	__u8 offcpu_by_comm;
};

#endif
