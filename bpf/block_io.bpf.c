// SPDX-License-Identifier: GPL-2.0
/*
 * Block I/O: block_rq_issue stamps the request, block_rq_complete adds the
 * latency and the completed bytes to the (disk, op) series. block_rq_issue
 * lost its request_queue argument in Linux 5.11; both shapes are here and user
 * space picks by the argument count in the kernel's BTF.
 *
 * The issue stamp is kept by (hardware queue, driver tag), which identifies a
 * request in flight: an array slot per tag under a read-mostly hash of
 * hardware queues, so neither end takes a lock or allocates. Requests without
 * a tag in range fall back to a hash keyed by the request.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "block_io.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"

#define REQ_OP_MASK 0xff

static const struct blockio_value zero_value = {};

struct tag_stamps {
	__u64 ts[BLOCKIO_TAGS];
	/* The disk's name, read when the queue is first seen or its disk changed
	 * (a queue freed and its memory reused for another disk). */
	__u64 disk_ptr;
	char disk[BLOCKIO_DISK_NAME_LEN];
};

static const struct tag_stamps zero_stamps = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLOCKIO_MAX_HW_QUEUES);
	__type(key, __u64); /* struct blk_mq_hw_ctx * */
	__type(value, struct tag_stamps);
} by_tag SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLOCKIO_MAX_IN_FLIGHT);
	__type(key, __u64); /* struct request * */
	__type(value, __u64);
} issued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, BLOCKIO_MAX_SERIES);
	__type(key, struct blockio_key);
	__type(value, struct blockio_value);
} series SEC(".maps");

EMD_DROPS_MAP(BLOCKIO_DROP__COUNT);

static __always_inline void read_disk_name(struct gendisk *disk, char *name)
{
	bpf_probe_read_kernel_str(name, BLOCKIO_DISK_NAME_LEN, &disk->disk_name);
}

/* The stamps of the request's hardware queue, or NULL when the request has no
 * tag in range. */
static __always_inline struct tag_stamps *queue_stamps(struct request *rq,
						       bool raw, bool create)
{
	__u64 hctx = (__u64)EMD_READ(raw, rq, mq_hctx);
	struct tag_stamps *st;
	struct gendisk *disk;

	if (!hctx)
		return NULL;
	st = bpf_map_lookup_elem(&by_tag, &hctx);
	if (!create)
		return st;
	if (!st) {
		if (bpf_map_update_elem(&by_tag, &hctx, &zero_stamps,
					BPF_NOEXIST))
			return NULL; /* full: the request takes the fallback */
		st = bpf_map_lookup_elem(&by_tag, &hctx);
		if (!st)
			return NULL;
	}
	disk = EMD_READ(raw, rq, q, disk);
	if (st->disk_ptr != (__u64)disk) {
		read_disk_name(disk, st->disk);
		st->disk_ptr = (__u64)disk;
	}
	return st;
}

static __always_inline int on_issue(struct request *rq, bool raw)
{
	__u64 key = (__u64)rq, now = bpf_ktime_get_ns();
	__u32 tag = EMD_READ(raw, rq, tag);
	struct tag_stamps *st;

	if (tag < BLOCKIO_TAGS) {
		st = queue_stamps(rq, raw, true);
		if (st) {
			st->ts[tag & (BLOCKIO_TAGS - 1)] = now;
			return 0;
		}
	}
	if (bpf_map_update_elem(&issued, &key, &now, BPF_ANY))
		emd_count_drop(&drops, BLOCKIO_DROP_IN_FLIGHT_FULL);
	return 0;
}

static __always_inline int on_complete(struct request *rq,
				       unsigned int nr_bytes, bool raw)
{
	struct blockio_key key = {};
	struct blockio_value *v;
	struct tag_stamps *st;
	__u64 rqkey = (__u64)rq, *ts, delta;
	__u32 op, tag;

	tag = EMD_READ(raw, rq, tag);
	st = tag < BLOCKIO_TAGS ? queue_stamps(rq, raw, false) : NULL;
	if (st) {
		ts = &st->ts[tag & (BLOCKIO_TAGS - 1)];
		if (!*ts)
			return 0; /* issued before we attached */
		delta = bpf_ktime_get_ns() - *ts;
		*ts = 0;
		__builtin_memcpy(key.disk, st->disk, sizeof(key.disk));
	} else {
		ts = bpf_map_lookup_elem(&issued, &rqkey);
		if (!ts)
			return 0;
		delta = bpf_ktime_get_ns() - *ts;
		bpf_map_delete_elem(&issued, &rqkey);
		read_disk_name(EMD_READ(raw, rq, q, disk), key.disk);
	}
	op = EMD_READ(raw, rq, cmd_flags) & REQ_OP_MASK;
	key.op = op <= BLOCKIO_OP_DISCARD ? op : BLOCKIO_OP_OTHER;
	v = emd_lookup_or_init(&series, &key, &zero_value, &drops,
			       BLOCKIO_DROP_SERIES_FULL);
	if (!v)
		return 0;
	emd_hist_add(v, delta);
	v->bytes += nr_bytes;
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue_btf, struct request *rq)
{
	return on_issue(rq, false);
}

/* before 5.11: block_rq_issue(struct request_queue *q, struct request *rq) */
SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue_btf_q, void *q, struct request *rq)
{
	return on_issue(rq, false);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete_btf, struct request *rq, int error,
	     unsigned int nr_bytes)
{
	return on_complete(rq, nr_bytes, false);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(block_rq_issue_raw, struct request *rq)
{
	return on_issue(rq, true);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(block_rq_issue_raw_q, void *q, struct request *rq)
{
	return on_issue(rq, true);
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(block_rq_complete_raw, struct request *rq, int error,
	     unsigned int nr_bytes)
{
	return on_complete(rq, nr_bytes, true);
}

char LICENSE[] SEC("license") = "GPL";
