/* SPDX-License-Identifier: GPL-2.0 */
/* Layout shared by runqueue_latency.bpf.c and src/tracers/runqueue_latency.cpp. */
#ifndef EBPF_METRICSD_RUNQUEUE_LATENCY_H
#define EBPF_METRICSD_RUNQUEUE_LATENCY_H

#include "common/task_labels.h"

enum runq_drop_reason {
	RUNQ_DROP_TASK_STATE = 0, /* no per-task state for a task */
	RUNQ_DROP_MAP_FULL = 1,   /* the labelled histogram map is full */
	RUNQ_DROP__COUNT,
};

#endif
