/* SPDX-License-Identifier: GPL-2.0 */
/* Layout shared by offcpu_time.bpf.c and src/tracers/offcpu_time.cpp. */
#ifndef EBPF_METRICSD_OFFCPU_TIME_H
#define EBPF_METRICSD_OFFCPU_TIME_H

#include "common/task_labels.h"

/* As the kernel counts nvcsw and nivcsw. */
enum offcpu_switch_kind {
	OFFCPU_SWITCH_VOLUNTARY = 0,
	OFFCPU_SWITCH_INVOLUNTARY = 1,
	OFFCPU_SWITCH__COUNT,
};

enum offcpu_drop_reason {
	OFFCPU_DROP_TASK_STATE = 0,     /* no per-task state for a task */
	OFFCPU_DROP_MAP_FULL = 1,       /* the labelled histogram map is full */
	OFFCPU_DROP_SLOW_LIMITED = 2,   /* slow waits over max_per_second */
	OFFCPU_DROP_SLOW_RING_FULL = 3, /* slow waits finding the ring full */
	OFFCPU_DROP_SLOW_EXITING = 4,   /* slow waits of exiting tasks: no user stack */
	OFFCPU_DROP_WAKE_MISSED = 5,    /* a wait whose end was not seen */
	OFFCPU_DROP__COUNT,
};

#endif
