// SPDX-License-Identifier: GPL-2.0
/*
 * An independent count of CPU-clock samples that land in one process
 * (target_tgid), for the profile tests: perf events of its own, at the
 * profile's frequency. A guest whose virtual CPU is starved by its host takes
 * fewer samples than its CPU time accounts for; this count sees the same.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

volatile __u32 target_tgid = 0;
__u64 samples = 0;

SEC("perf_event")
int oracle_sample(struct bpf_perf_event_data *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (target_tgid && tgid == target_tgid)
		__sync_fetch_and_add(&samples, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
