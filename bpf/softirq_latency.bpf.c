// SPDX-License-Identifier: GPL-2.0
/*
 * Softirqs by vector: how often each handler runs (as /proc/softirqs counts
 * them), the time from a softirq being raised on a CPU to its handler
 * starting there (a softirq runs on the CPU that raised it; raises before it
 * runs are one pending bit, timed from the first), and the handler's run time.
 * The kernel takes the pending bits at the start of each round of handlers and
 * clears them: a raise while a handler runs on the CPU sets the bit again for
 * the next round, so it is kept apart (`raised_next`) until the current round
 * has run the vector. Softirqs do not nest on a CPU, so per-CPU slots hold the
 * stamps: no hash, no lock. Each hook exists as tp_btf and raw_tp.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "softirq_latency.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SOFTIRQ_VECTORS);
	__type(key, __u32);
	__type(value, struct softirq_stats);
} stats SEC(".maps");

/* ns of the first raise of each vector not yet handled on this CPU, 0: none:
 * for the round of handlers to come (raised), and for the one after, raised
 * while a handler ran (raised_next). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SOFTIRQ_VECTORS);
	__type(key, __u32);
	__type(value, __u64);
} raised SEC(".maps"), raised_next SEC(".maps");

/* The vector whose handler runs on this CPU, +1; 0: none. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} running SEC(".maps");

/* ns when the handler running on this CPU started, 0: none. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SOFTIRQ_VECTORS);
	__type(key, __u32);
	__type(value, __u64);
} started SEC(".maps");

EMD_DROPS_MAP(SOFTIRQ_DROP__COUNT);

static __always_inline __u64 *slot_of(void *map, __u32 vec)
{
	if (vec >= SOFTIRQ_VECTORS) {
		emd_count_drop(&drops, SOFTIRQ_DROP_VECTOR);
		return NULL;
	}
	return bpf_map_lookup_elem(map, &vec);
}

static __always_inline __u32 *running_slot(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&running, &zero);
}

static __always_inline int on_raise(__u32 vec)
{
	__u32 *run = running_slot();
	__u64 *t =
	    slot_of(run && *run ? (void *)&raised_next : (void *)&raised, vec);

	if (t && !*t)
		*t = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_entry(__u32 vec)
{
	__u64 now = bpf_ktime_get_ns(), *t = slot_of(&raised, vec), *next, *s;
	struct softirq_stats *st;
	__u32 *run = running_slot();

	if (!t || !run)
		return 0;
	st = bpf_map_lookup_elem(&stats, &vec);
	s = bpf_map_lookup_elem(&started, &vec);
	next = bpf_map_lookup_elem(&raised_next, &vec);
	if (!st || !s || !next)
		return 0;
	st->entries += 1;
	/* This round's raise, or, in a round after the first, the one that came
	 * while an earlier round ran. */
	if (!*t) {
		*t = *next;
		*next = 0;
	}
	if (*t) {
		__u64 ns = now - *t;

		st->latency[emd_seconds_slot(ns)] += 1;
		st->latency_sum += ns;
		*t = 0;
	} else {
		emd_count_drop(&drops, SOFTIRQ_DROP_UNSEEN_RAISE);
	}
	*s = now;
	*run = vec + 1;
	return 0;
}

static __always_inline int on_exit(__u32 vec)
{
	__u64 *s = slot_of(&started, vec), ns;
	struct softirq_stats *st;

	if (!s)
		return 0;
	if (!*s) {
		emd_count_drop(&drops, SOFTIRQ_DROP_UNSEEN_ENTRY);
		return 0;
	}
	st = bpf_map_lookup_elem(&stats, &vec);
	if (!st)
		return 0;
	ns = bpf_ktime_get_ns() - *s;
	st->runtime[emd_seconds_slot(ns)] += 1;
	st->runtime_sum += ns;
	*s = 0;
	return 0;
}

/* The handler is done: raises from now on are for the round to come. */
static __always_inline int on_exit_done(__u32 vec)
{
	__u32 *run = running_slot();

	on_exit(vec);
	if (run)
		*run = 0;
	return 0;
}

#define RAISE(raw) on_raise(vec_nr)
#define ENTRY(raw) on_entry(vec_nr)
#define EXIT(raw) on_exit_done(vec_nr)

EMD_TP_PROGS(softirq_raise, softirq_raise, RAISE, unsigned int vec_nr)
EMD_TP_PROGS(softirq_entry, softirq_entry, ENTRY, unsigned int vec_nr)
EMD_TP_PROGS(softirq_exit, softirq_exit, EXIT, unsigned int vec_nr)

char LICENSE[] SEC("license") = "GPL";
