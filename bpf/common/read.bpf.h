/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_READ_BPF_H
#define EBPF_METRICSD_READ_BPF_H

#include <bpf/bpf_core_read.h>

/*
 * Field reads for programs that exist as tp_btf and raw_tp twins:
 * EMD_READ(raw, s, a, b) is s->a->b. tp_btf hands over BTF-typed pointers the
 * verifier lets us load from directly (no helper call); raw_tp hands over
 * plain numbers that need bpf_probe_read_kernel (BPF_CORE_READ). `raw` is a
 * constant at every call site, so only one branch is compiled.
 */
#define EMD_READ(raw, ...)                                                     \
	((raw) ? BPF_CORE_READ(__VA_ARGS__) : ___arrow(__VA_ARGS__))

#endif
