/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Per-thread state of a tracer on scheduler hooks. With tp_btf it lives in
 * task-local storage (freed with the task); with raw_tp, whose task pointers
 * the storage helpers do not accept, and on kernels whose tracing programs
 * have no task storage (5.10), in a preallocated hash keyed by thread id that
 * the raw_tp program <name>_free empties at sched_process_free. User space
 * makes one of the two maps and sizes the hash (configure_task_state).
 *
 *   EMD_TASK_STATE(name, value_type)
 * defines name_task, name_by_tid, the program name_free and
 *   value_type *name_of(struct task_struct *t, bool create, bool raw,
 *                 void *drops, __u32 reason)
 * which returns t's state, made when `create` (a failure counted under
 * `reason`), or NULL; the idle tasks (pid 0, one per CPU) have none.
 */
#ifndef EBPF_METRICSD_TASK_STATE_BPF_H
#define EBPF_METRICSD_TASK_STATE_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"

#define EMD_TASK_STATE(name, value_type)                                       \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_TASK_STORAGE);                       \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
		__type(key, int);                                              \
		__type(value, value_type);                                     \
	} name##_task SEC(".maps");                                            \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, 1);                                        \
		__type(key, __u32);                                            \
		__type(value, value_type);                                     \
	} name##_by_tid SEC(".maps");                                          \
	static __always_inline value_type *name##_of(                          \
	    struct task_struct *t, bool create, bool raw, void *drops,         \
	    __u32 reason)                                                      \
	{                                                                      \
		static const value_type zero = {};                             \
		__u32 tid = EMD_READ(raw, t, pid);                             \
		value_type *s;                                                 \
                                                                               \
		if (tid == 0)                                                  \
			return NULL;                                           \
		if (!raw) {                                                    \
			s = bpf_task_storage_get(                              \
			    &name##_task, t, 0,                                \
			    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);      \
			if (!s && create)                                      \
				emd_count_drop(drops, reason);                 \
			return s;                                              \
		}                                                              \
		if (!create)                                                   \
			return bpf_map_lookup_elem(&name##_by_tid, &tid);      \
		return emd_lookup_or_init(&name##_by_tid, &tid, &zero, drops,  \
					  reason);                             \
	}                                                                      \
	/* The current thread's state, looked up only (tp_btf: with the   */  \
	/* helper of 5.11+).                                               */  \
	static __always_inline __attribute__((unused)) value_type *            \
	name##_current(bool raw)                                               \
	{                                                                      \
		__u32 tid = (__u32)bpf_get_current_pid_tgid();                 \
                                                                               \
		if (raw)                                                       \
			return bpf_map_lookup_elem(&name##_by_tid, &tid);      \
		return bpf_task_storage_get(&name##_task,                      \
					    bpf_get_current_task_btf(), 0, 0); \
	}                                                                      \
	SEC("raw_tp/sched_process_free")                                       \
	int BPF_PROG(name##_free, struct task_struct *p)                       \
	{                                                                      \
		__u32 tid = BPF_CORE_READ(p, pid);                             \
                                                                               \
		bpf_map_delete_elem(&name##_by_tid, &tid);                     \
		return 0;                                                      \
	}

#endif
