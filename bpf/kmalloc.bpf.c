// SPDX-License-Identifier: GPL-2.0
/*
 * kmalloc/kfree calls, requested and allocated bytes, a log2 histogram of
 * requested sizes; optionally kmem_cache_alloc/free per cache. Each hook as
 * tp_btf and raw_tp; user space autoloads one kind. The per-cache programs
 * read the cache from the third argument, which kmem_cache_free has had since
 * Linux 5.12 and kmem_cache_alloc since 6.1: user space checks the kernel's
 * BTF before loading them.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "kmalloc.h"

static const struct kmalloc_cache_counts zero_counts = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kmalloc_totals);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kmalloc_hist);
} sizes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, KMALLOC_MAX_CACHES);
	__type(key, struct kmalloc_cache_key);
	__type(value, struct kmalloc_cache_counts);
} caches SEC(".maps");

EMD_DROPS_MAP(KMALLOC_DROP__COUNT);

static __always_inline int on_kmalloc(size_t requested, size_t allocated)
{
	struct kmalloc_totals *t;
	struct kmalloc_hist *h;
	__u32 zero = 0;

	t = bpf_map_lookup_elem(&totals, &zero);
	if (t) {
		t->kmalloc_calls += 1;
		t->bytes_requested += requested;
		t->bytes_allocated += allocated;
	}
	h = bpf_map_lookup_elem(&sizes, &zero);
	if (h)
		emd_hist_add_bytes(h, requested);
	return 0;
}

static __always_inline int on_kfree(void)
{
	struct kmalloc_totals *t;
	__u32 zero = 0;

	t = bpf_map_lookup_elem(&totals, &zero);
	if (t)
		t->kfree_calls += 1;
	return 0;
}

static __always_inline struct kmalloc_cache_counts *
cache_counts(const struct kmem_cache *s)
{
	struct kmalloc_cache_key key = {};

	bpf_probe_read_kernel_str(key.name, sizeof(key.name),
				  BPF_CORE_READ(s, name));
	return emd_lookup_or_init(&caches, &key, &zero_counts, &drops,
				  KMALLOC_DROP_CACHES_FULL);
}

static __always_inline int on_cache_alloc(const struct kmem_cache *s)
{
	struct kmalloc_cache_counts *c = cache_counts(s);

	if (c)
		c->allocs += 1;
	return 0;
}

static __always_inline int on_cache_free(const struct kmem_cache *s)
{
	struct kmalloc_cache_counts *c = cache_counts(s);

	if (c)
		c->frees += 1;
	return 0;
}

#define KMALLOC(raw) on_kmalloc(bytes_req, bytes_alloc)
#define KFREE(raw) on_kfree()
#define CACHE_ALLOC(raw) on_cache_alloc(s)
#define CACHE_FREE(raw) on_cache_free(s)

EMD_TP_PROGS(kmalloc, kmalloc, KMALLOC, unsigned long call_site, const void *ptr,
	     size_t bytes_req, size_t bytes_alloc)
/* Before Linux 6.1 kmalloc_node() had its own tracepoint; user space loads
 * these where the kernel has it. */
EMD_TP_PROGS(kmalloc_node, kmalloc_node, KMALLOC, unsigned long call_site,
	     const void *ptr, size_t bytes_req, size_t bytes_alloc)
EMD_TP_PROGS(kfree, kfree, KFREE, unsigned long call_site, const void *ptr)
EMD_TP_PROGS(kmem_cache_alloc, cache_alloc, CACHE_ALLOC, unsigned long call_site,
	     const void *ptr, struct kmem_cache *s)
EMD_TP_PROGS(kmem_cache_free, cache_free, CACHE_FREE, unsigned long call_site,
	     const void *ptr, const struct kmem_cache *s)

char LICENSE[] SEC("license") = "GPL";
