// SPDX-License-Identifier: GPL-2.0
/*
 * Page cache accesses, misses and dirtied pages:
 *  - accesses: where fentry (else a kprobe) works, every
 *    folio_mark_accessed() (as libbpf-tools' cachestat), or
 *    mark_page_accessed() before folios (5.16);
 *    else, from tracepoints, the page range each read asks filemap_get_pages
 *    for, plus mmap faults (mm_filemap_fault) and fault-around
 *    (mm_filemap_map_pages);
 *  - misses: pages added to the page cache (mm_filemap_add_to_page_cache,
 *    which passes a folio since 5.16 and a page before);
 *  - dirtied: pages marked dirty (writeback_dirty_folio, or
 *    writeback_dirty_page before 5.17).
 * User space loads one program per event from what the kernel has.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "page_cache.h"

/* Before Linux 6.9 (approximately) the count of a large folio's pages was
 * _folio_nr_pages; now it is _nr_pages. */
struct folio___old {
	unsigned int _folio_nr_pages;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct page_cache_totals);
} totals SEC(".maps");

/*
 * One read is served in batches, and filemap_get_pages reports the range from
 * the batch's first page to the end of the whole read each time. The last call
 * on this CPU is remembered so that a continuation batch is not counted again.
 */
struct last_read {
	__u64 mapping;
	__u64 index;
	__u64 last_index;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct last_read);
} last SEC(".maps");

EMD_CGROUP_MAP(totals_by_cgroup, __u64, struct page_cache_totals);

static const struct page_cache_totals zero_totals = {};

EMD_DROPS_MAP(PAGE_CACHE_DROP__COUNT);

static __always_inline struct page_cache_totals *get_totals(void)
{
	__u32 zero = 0;

	if (emd_by_cgroup) {
		__u64 cgroup = bpf_get_current_cgroup_id();

		return emd_lookup_or_init(&totals_by_cgroup, &cgroup, &zero_totals,
					  &drops, PAGE_CACHE_DROP_LABELS_FULL);
	}
	return bpf_map_lookup_elem(&totals, &zero);
}

/* folio.flags and page.flags are a plain unsigned long before 6.18 and a
 * memdesc_flags_t since: CO-RE matches a field only of a compatible type. */
struct folio___flags_ulong {
	unsigned long flags;
} __attribute__((preserve_access_index));

struct page___flags_ulong {
	unsigned long flags;
} __attribute__((preserve_access_index));

/* The order of a compound page, kept in its first tail page before 6.3. */
struct page___compound_order {
	unsigned char compound_order;
} __attribute__((preserve_access_index));

static __always_inline __u64 pg_head_bit(void)
{
	return 1ULL << bpf_core_enum_value(enum pageflags, PG_head);
}

static __always_inline __u64 folio_pages(struct folio *folio)
{
	struct folio___flags_ulong *old = (void *)folio;
	__u64 flags = 0;

	if (bpf_core_field_exists(old->flags))
		bpf_core_read(&flags, sizeof(flags), &old->flags);
	else
		bpf_core_read(&flags, sizeof(flags), &folio->flags);
	if (!(flags & pg_head_bit()))
		return 1;
	if (bpf_core_field_exists(folio->_nr_pages))
		return BPF_CORE_READ(folio, _nr_pages);
	if (bpf_core_field_exists(((struct folio___old *)folio)->_folio_nr_pages))
		return BPF_CORE_READ((struct folio___old *)folio,
				     _folio_nr_pages);
	return 1;
}

/* Pages of a page as the pre-folio kernels pass it: 1, or a compound page's
 * 2^order for its head page. */
static __always_inline __u64 page_pages(struct page *page)
{
	struct page___flags_ulong *old = (void *)page;
	struct page___compound_order *tail;
	__u64 flags = 0;

	if (bpf_core_field_exists(old->flags))
		bpf_core_read(&flags, sizeof(flags), &old->flags);
	else
		bpf_core_read(&flags, sizeof(flags), &page->flags);
	if (!(flags & pg_head_bit()))
		return 1;
	tail = (void *)((char *)page + bpf_core_type_size(struct page));
	if (bpf_core_field_exists(tail->compound_order))
		return 1ULL << (BPF_CORE_READ(tail, compound_order) & 31);
	return 1;
}

static __always_inline int on_get_pages(void *mapping, __u64 index,
					__u64 last_index)
{
	struct page_cache_totals *t = get_totals();
	struct last_read *l;
	__u32 zero = 0;

	if (!t || last_index < index)
		return 0;
	l = bpf_map_lookup_elem(&last, &zero);
	if (l) {
		if (l->mapping == (__u64)mapping && l->last_index == last_index &&
		    index > l->index) {
			l->index = index; /* next batch of the same read */
			return 0;
		}
		l->mapping = (__u64)mapping;
		l->index = index;
		l->last_index = last_index;
	}
	t->accesses += last_index - index + 1;
	return 0;
}

static __always_inline int add_accesses(__u64 n)
{
	struct page_cache_totals *t = get_totals();

	if (t)
		t->accesses += n;
	return 0;
}

static __always_inline int add_misses(__u64 pages)
{
	struct page_cache_totals *t = get_totals();

	if (t)
		t->misses += pages;
	return 0;
}

static __always_inline int add_dirtied(__u64 pages)
{
	struct page_cache_totals *t = get_totals();

	if (t)
		t->dirtied += pages;
	return 0;
}

SEC("fentry/folio_mark_accessed")
int BPF_PROG(mark_accessed_fentry, struct folio *folio)
{
	return add_accesses(folio_pages(folio));
}

SEC("fentry/mark_page_accessed")
int BPF_PROG(mark_page_accessed_fentry, struct page *page)
{
	return add_accesses(page_pages(page));
}

/* The same through kprobes, for kernels without BTF of their own (fentry
 * needs it; kprobes only need BTF for CO-RE, which btf_path can supply). */
SEC("kprobe/folio_mark_accessed")
int BPF_KPROBE(mark_accessed_kprobe, struct folio *folio)
{
	return add_accesses(folio_pages(folio));
}

SEC("kprobe/mark_page_accessed")
int BPF_KPROBE(mark_page_accessed_kprobe, struct page *page)
{
	return add_accesses(page_pages(page));
}

#define GET_PAGES(raw) on_get_pages(mapping, index, last_index)
#define MAP_PAGES(raw) add_accesses(end >= start ? end - start + 1 : 0)
#define FAULT(raw) add_accesses(1)
#define ADDED(raw) add_misses(folio_pages(folio))
#define ADDED_PAGE(raw) add_misses(page_pages(page))
#define DIRTIED(raw) add_dirtied(folio_pages(folio))
#define DIRTIED_PAGE(raw) add_dirtied(page_pages(page))

EMD_TP_PROGS(mm_filemap_get_pages, get_pages, GET_PAGES,
	     struct address_space *mapping, unsigned long index,
	     unsigned long last_index)
EMD_TP_PROGS(mm_filemap_map_pages, map_pages, MAP_PAGES,
	     struct address_space *mapping, unsigned long start,
	     unsigned long end)
EMD_TP_PROGS(mm_filemap_fault, fault, FAULT)
EMD_TP_PROGS(mm_filemap_add_to_page_cache, add_to_page_cache, ADDED,
	     struct folio *folio)
EMD_TP_PROGS(mm_filemap_add_to_page_cache, add_page_to_page_cache, ADDED_PAGE,
	     struct page *page)
EMD_TP_PROGS(writeback_dirty_folio, dirty_folio, DIRTIED, struct folio *folio)
EMD_TP_PROGS(writeback_dirty_page, dirty_page, DIRTIED_PAGE, struct page *page)

char LICENSE[] SEC("license") = "GPL";
