/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Log2 histogram slots, shared by the BPF programs and by user space (which
 * unit-tests the very same code).
 *
 * Slot k counts values v with 2^(k-1) < v <= 2^k (slot 0 counts 0 and 1), so
 * the Prometheus upper bound of slot k is exactly 2^k units and "le" is exact
 * for integer values.
 *
 * Branch-free: comparisons are done as "(c - v) >> 63" so that clang emits no
 * jumps, and no __builtin_clzll, which clang 14 cannot lower for BPF.
 */
#ifndef EBPF_METRICSD_LOG2_SLOT_H
#define EBPF_METRICSD_LOG2_SLOT_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* 1 when v > c, else 0; valid while v - c < 2^63, which holds for every
 * value below 2^63 (ns, bytes, ...). */
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
	/* x = v - 1, saturating at 0 */
	__u64 x = v - 1 + ((v - 1) >> 63);
	/* bit length of x: floor_log2(x) + (x != 0) */
	__u64 slot = (__u64)emd_floor_log2(x) + ((0 - x) >> 63);

	if (slot > max_slot)
		slot = max_slot;
	return slot;
}

#endif
