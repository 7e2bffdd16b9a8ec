// SPDX-License-Identifier: GPL-2.0
/*
 * OOM kills by the victim's cgroup: oom:mark_victim fires once for every task
 * the OOM killer (global or of a memory cgroup) chooses and kills. Since
 * Linux 6.9 (and 6.6.80, 6.1.130, 5.15.179, 5.10.235) it passes the victim's
 * task; user space checks that prototype in the kernel's BTF before loading.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "oom_kills.h"

/* Kills by (cgroup, parent). Preallocated: a kill must not need an allocation
 * under memory pressure. */
EMD_CGROUP_MAP_PREALLOC(kills, struct oom_key, __u64);

EMD_DROPS_MAP(OOM_DROP__COUNT);

static const __u64 zero_count = 0;

static __always_inline int on_victim(struct task_struct *task)
{
	/* The victim, not the current task: a memory cgroup's OOM runs in the
	 * task that charged the page, a global one anywhere. */
	struct cgroup *cg = BPF_CORE_READ(task, cgroups, dfl_cgrp);
	struct oom_key key = {
		.cgroup = BPF_CORE_READ(cg, kn, id),
		.parent = BPF_CORE_READ(cg, self.parent, cgroup, kn, id),
	};
	__u64 *n = emd_lookup_or_init(&kills, &key, &zero_count, &drops,
				      OOM_DROP_LABELS_FULL);

	if (n)
		*n += 1;
	return 0;
}

#define VICTIM(raw) on_victim(task)

EMD_TP_PROGS(mark_victim, mark_victim, VICTIM, struct task_struct *task, __u32 uid)

char LICENSE[] SEC("license") = "GPL";
