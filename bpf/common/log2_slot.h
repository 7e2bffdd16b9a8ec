/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Log2 histogram slots, shared by the BPF programs and by user space (which
 * unit-tests the very same code).
 *
 * Every histogram slot is a power of two of the exported unit, so that a
 * Prometheus "le" bound is exact and a native histogram of schema 0 (bucket e
 * holds (2^(e-1), 2^e]) carries the slots unchanged:
 *
 * - latencies, measured in ns and exported in seconds: slot 0 holds 0 ns (the
 *   native zero bucket), slot k >= 1 holds (2^(k-31), 2^(k-30)] s, i.e.
 *   exponent e = k - 30 (slot 1: 1 ns <= 2^-29 s, slot 30: (0.5 s, 1 s]);
 * - bytes: slot 0 holds 0, slot k >= 1 holds (2^(k-2), 2^(k-1)] bytes.
 *
 * The last slot also holds everything beyond it (2^33 s, 2^62 bytes: never
 * reached by real values).
 *
 * Branch-free: comparisons are done as "(c - v) >> 63" so that clang emits no
 * jumps, and no __builtin_clzll, which clang 14 cannot lower for BPF.
 */
#ifndef EBPF_METRICSD_LOG2_SLOT_H
#define EBPF_METRICSD_LOG2_SLOT_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* 1 when v > c, else 0; exact while v and c differ by at most 2^63, which
 * holds when both are below 2^63 (ns, bytes, ...). */
#define EMD_GT(v, c) ((__u64)((__u64)(c) - (__u64)(v)) >> 63)

static __always_inline __u32 emd_floor_log2(__u64 v)
{
	__u32 r, s;

	r = (__u32)EMD_GT(v, 0xFFFFFFFFULL) << 5;
	v >>= r;
	s = (__u32)EMD_GT(v, 0xFFFF) << 4;
	v >>= s;
	r |= s;
	s = (__u32)EMD_GT(v, 0xFF) << 3;
	v >>= s;
	r |= s;
	s = (__u32)EMD_GT(v, 0xF) << 2;
	v >>= s;
	r |= s;
	s = (__u32)EMD_GT(v, 0x3) << 1;
	v >>= s;
	r |= s;
	return r | (__u32)(v >> 1);
}

/*
 * ceil(log2(v)), with 0 and 1 in slot 0, clamped to max_slot. 64-bit all the
 * way: a 32-bit slot makes clang compare a zero-extended copy and index with
 * the original, which the verifier rejects as unbounded.
 */
static __always_inline __u64 emd_log2_slot(__u64 v, __u64 max_slot)
{
	/* x = v - 1, or 0 for v = 0 (for v > 2^63, x = v: still clamped) */
	__u64 x = v - 1 + ((v - 1) >> 63);
	/* bit length of x: floor_log2(x) + (x != 0) */
	__u64 slot = (__u64)emd_floor_log2(x) + ((0 - x) >> 63);

	if (slot > max_slot)
		slot = max_slot;
	return slot;
}

/* Slots of every histogram: slot k >= 1 is exponent k + EMD_*_ZERO_EXP. */
#define EMD_HIST_SLOTS 64
/* Exponent (in the exported unit) whose bucket slot 0 stands in for: values
 * at or below 2^EMD_SECONDS_ZERO_EXP s (only 0 ns) or 2^EMD_BYTES_ZERO_EXP
 * bytes (only 0) are counted in slot 0. */
#define EMD_SECONDS_ZERO_EXP (-30)
#define EMD_BYTES_ZERO_EXP (-1)

/*
 * floor(2^(s-30) * 1e9) for s in 0..63: the largest ns count that is at most
 * 2^(s-30) seconds. 1e9 * 2^33 still fits in 63 bits, so one right shift of
 * that constant gives the whole table exactly (tests/unit compares it with
 * the table computed in 128-bit integers).
 */
#define EMD_NS_PER_S_SHL33 (1000000000ULL << 33)
static __always_inline __u64 emd_ns_threshold(__u64 s)
{
	return EMD_NS_PER_S_SHL33 >> (63 - s);
}

/*
 * Slot of a latency of ns nanoseconds: the smallest e with ns <= 2^e * 1e9,
 * as slot e + 30. The log2 step gives s = ceil(log2(ns)), so that
 * 2^(s-1) < ns <= 2^s; since 2^(s-30) s = 0.93 * 2^s ns and 2^(s-29) s =
 * 1.86 * 2^s ns, e is s - 30 or s - 29, and one comparison with the threshold
 * of 2^(s-30) s decides.
 */
static __always_inline __u64 emd_seconds_slot(__u64 ns)
{
	/*
	 * s at most 62 and the comparison adding at most 1 keep the slot within
	 * 63 with no second clamp: 5.10's and 6.1's verifiers follow a clamp
	 * after the addition into a branch that cannot be taken, with bounds
	 * they then lose. ns of 2^62 and more go to the last slot: above
	 * floor(2^32 * 1e9) they compare greater, and from 2^63 on (where the
	 * comparison no longer holds) the top bit says so.
	 */
	__u64 s = emd_log2_slot(ns, 62);

	return s + (EMD_GT(ns, emd_ns_threshold(s)) | (ns >> 63));
}

/* Slot of a byte count: 0 for 0, else ceil(log2(v)) + 1 (at most the last). */
static __always_inline __u64 emd_bytes_slot(__u64 v)
{
	/* v != 0 without a branch: v or -v has the top bit set unless v is 0 */
	return emd_log2_slot(v, EMD_HIST_SLOTS - 2) + ((v | (0 - v)) >> 63);
}

#endif
