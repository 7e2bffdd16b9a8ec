/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_OOM_KILLS_H
#define EBPF_METRICSD_OOM_KILLS_H

enum oom_kills_drop_reason {
	OOM_DROP_LABELS_FULL = 0, /* no room for another cgroup */
	OOM_DROP__COUNT,
};

#endif
