/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_READ_BPF_H
#define EBPF_METRICSD_READ_BPF_H

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/*
 * Field reads for programs that exist as tp_btf and raw_tp twins:
 * EMD_READ(raw, s, a, b) is s->a->b. tp_btf hands over BTF-typed pointers the
 * verifier lets us load from directly (no helper call); raw_tp hands over
 * plain numbers that need bpf_probe_read_kernel (BPF_CORE_READ). `raw` is a
 * constant at every call site, so only one branch is compiled.
 */
#define EMD_READ(raw, ...)                                                     \
	((raw) ? BPF_CORE_READ(__VA_ARGS__) : ___arrow(__VA_ARGS__))

/*
 * One tracepoint handler as the twins tp_btf/<tp> (<name>_btf) and
 * raw_tp/<tp> (<name>_raw). `call` is a macro of `raw` that runs the shared
 * body with the arguments named in the prototype `args`.
 */
#define EMD_TP_PROGS(tp, name, call, args...)                                 \
	SEC("tp_btf/" #tp)                                                     \
	int BPF_PROG(name##_btf, ##args)                                       \
	{                                                                      \
		return call(false);                                            \
	}                                                                      \
	SEC("raw_tp/" #tp)                                                     \
	int BPF_PROG(name##_raw, ##args)                                       \
	{                                                                      \
		return call(true);                                             \
	}

#endif
