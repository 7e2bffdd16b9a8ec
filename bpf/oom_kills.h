/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_OOM_KILLS_H
#define EBPF_METRICSD_OOM_KILLS_H

/* The victim's cgroup and its parent (its pod, for a container): the parent
 * names the kill when the victim's cgroup is removed before a drain names it. */
struct oom_key {
	__u64 cgroup;
	__u64 parent;
};

enum oom_kills_drop_reason {
	OOM_DROP_LABELS_FULL = 0, /* no room for another cgroup */
	OOM_DROP__COUNT,
};

#endif
