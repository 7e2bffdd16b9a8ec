// SPDX-License-Identifier: GPL-2.0
/*
 * Block I/O: block_rq_issue stamps the request, block_rq_complete adds the
 * latency and the completed bytes to the (disk, op) series. block_rq_issue
 * lost its request_queue argument in Linux 5.11; both shapes are here and user
 * space picks by the argument count in the kernel's BTF.
 *
 * The issue stamp is kept by (hardware queue, driver tag): each hardware queue
 * owns a slot of an array (from its queue ids, claimed on first use),
 * with a stamp per tag, so neither end hashes, locks or allocates. A request
 * whose queue lost the slot to another, or whose tag is out of range, falls
 * back to a hash keyed by the request.
 *
 * A completion the kernel does not deliver (rarely, a request's block_rq_complete
 * runs no program, and says so nowhere) leaves its stamp behind: the next issue
 * of another request on that tag, or of that struct request, finds it and counts
 * `complete_unseen`; until then user space shows it as in flight. A request is
 * told from the one before it on its tag by its struct request (blk-mq keeps one
 * per tag without an I/O scheduler, one per scheduler tag with one) and its
 * start_time_ns (shared by the requests of one plug: not enough alone). A
 * requeued request (the driver was busy) is the same request issued again, on
 * another tag where a scheduler hands tags out at dispatch: block_rq_requeue
 * takes its stamp out first.
 *
 * With `slow` (common/slow_return.bpf.h), each issue also keeps the issuing
 * task's stacks by request, and a request that completes at or above the
 * threshold is sent to user space: when its issuer returns from the system
 * call it waits in (a synchronous read), with a copy of the user stack it
 * returns to; else at once, with the stacks kept from the issue.
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "block_io.h"
#include "common/cgroup.bpf.h"
#include "common/maps.bpf.h"
#include "common/read.bpf.h"
#include "common/slow_return.bpf.h"

#define REQ_OP_MASK 0xff

static const struct blockio_value zero_value = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLOCKIO_MAX_IN_FLIGHT);
	__type(key, __u64); /* struct request * */
	__type(value, struct blockio_stamp);
} issued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, BLOCKIO_MAX_SERIES);
	__type(key, struct blockio_key);
	__type(value, struct blockio_value);
} series SEC(".maps");

/* Series of slotted requests: slot * BLOCKIO_OPS + op, a plain per-CPU array. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, BLOCKIO_QUEUE_SLOTS * BLOCKIO_OPS);
	__type(key, __u32);
	__type(value, struct blockio_value);
} slot_series SEC(".maps");

EMD_CGROUP_MAP(series_by_cgroup, struct blockio_cgroup_key, struct blockio_value);

EMD_DROPS_MAP(BLOCKIO_DROP__COUNT);


struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, BLOCKIO_QUEUE_SLOTS);
	__type(key, __u32);
	__type(value, struct blockio_queue);
} queues SEC(".maps");

/*
 * Who claimed each queue slot. Two queues that find the same slot free at the same moment
 * must not both take it (the loser's first stamp would be left in a slot that names the
 * winner, and its completion lost): the hash's insert with BPF_NOEXIST is atomic and picks
 * one. Consulted only when a queue claims a slot, never per request. (A compare-and-swap
 * on the slot would do, but BPF has none before 5.12.)
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BLOCKIO_QUEUE_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} slot_owner SEC(".maps");

static __always_inline bool claim_slot(__u32 *slot, __u64 hctx)
{
	__u64 *owner;

	if (bpf_map_update_elem(&slot_owner, slot, &hctx, BPF_NOEXIST) == 0)
		return true;
	owner = bpf_map_lookup_elem(&slot_owner, slot);
	return owner && *owner == hctx;
}

/* Before Linux 5.18 the request named its disk; since 5.15 the queue does. */
struct request___rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *request_disk(struct request *rq,
						    bool raw)
{
	struct request___rq_disk *old = (void *)rq;

	if (bpf_core_field_exists(old->rq_disk))
		return BPF_CORE_READ(old, rq_disk);
	return EMD_READ(raw, rq, q, disk);
}

/* tag as an index of q->ts. The mask is applied here, where the verifier sees
 * it on the register it indexes with: the compiler would otherwise drop it
 * after the tag < BLOCKIO_TAGS test, and older verifiers lose that bound when
 * the tag is spilled to the stack (6.1 rejects raw_tp/block_rq_complete). */
static __always_inline __u32 tag_index(__u32 tag)
{
	asm volatile("" : "+r"(tag));
	return tag & (BLOCKIO_TAGS - 1);
}

static __always_inline void read_disk_name(struct gendisk *disk, char *name)
{
	bpf_probe_read_kernel_str(name, BLOCKIO_DISK_NAME_LEN, &disk->disk_name);
}

/* Request queue ids are small integers (an ida), hardware queue numbers too. */
static __always_inline __u32 queue_slot_of(struct request *rq, bool raw)
{
	__u32 qid = EMD_READ(raw, rq, q, id);
	__u32 num = EMD_READ(raw, rq, mq_hctx, queue_num);

	return qid * 8 + num;
}

/* The slot of the request's hardware queue: the first of BLOCKIO_QUEUE_PROBES
 * slots from its home slot that it owns, or, on issue, that is free (then it
 * claims it). NULL when all are held by other queues. */
static __always_inline struct blockio_queue *
queue_of(struct request *rq, bool raw, bool issue, __u32 *slot)
{
	__u64 hctx = (__u64)EMD_READ(raw, rq, mq_hctx);
	struct blockio_queue *q = NULL;
	struct gendisk *disk;
	__u32 home, i;

	if (!hctx)
		return NULL;
	home = queue_slot_of(rq, raw);
	for (i = 0; i < BLOCKIO_QUEUE_PROBES; i++) {
		*slot = (home + i) & (BLOCKIO_QUEUE_SLOTS - 1);
		q = bpf_map_lookup_elem(&queues, slot);
		if (!q)
			return NULL;
		if (q->hctx == hctx)
			break;
		if (!q->hctx) {
			if (!issue)
				return NULL;
			if (claim_slot(slot, hctx)) {
				q->hctx = hctx;
				break;
			}
			/* Another queue won it this very moment: the next slot. */
		}
		q = NULL;
	}
	if (!q)
		return NULL;
	if (issue) {
		disk = request_disk(rq, raw);
		if (q->disk_ptr != (__u64)disk) {
			read_disk_name(disk, q->disk);
			q->disk_ptr = (__u64)disk;
		}
	}
	return q;
}

/*
 * The owner of a request: the cgroup it is charged to, its first bio's io
 * cgroup (the writer of dirty pages, not the flusher thread that issues them),
 * when that is a cgroup of the v2 hierarchy (hierarchy id 0) below the root.
 * Else the cgroup of the task that issued it: a cgroup without the io
 * controller is charged to its nearest ancestor that has one, often the root,
 * which names no workload; the io controller may sit on a v1 hierarchy; a
 * flush carries no data; a kernel may have no block cgroups.
 */
struct bio___blkg {
	struct blkcg_gq *bi_blkg;
} __attribute__((preserve_access_index));

static __always_inline __u64 request_cgroup(struct request *rq, __u64 issuer,
					     bool raw)
{
	struct bio___blkg *bio = (void *)EMD_READ(raw, rq, bio);
	struct cgroup *cg;

	if (!bio || !bpf_core_field_exists(bio->bi_blkg))
		return issuer;
	/* tp_btf: plain loads along BTF-typed pointers, no helper calls */
	cg = EMD_READ(raw, bio, bi_blkg, blkcg, css.cgroup);
	if (!cg || EMD_READ(raw, cg, root, hierarchy_id) != 0 || !EMD_READ(raw, cg, level))
		return issuer;
	return EMD_READ(raw, cg, kn, id);
}

/*
 * A stamp still held on the tag of a request being issued: another request's
 * (not this one requeued, which is the same struct request with the same start
 * time) whose completion was not seen.
 */
static __always_inline void stale_stamp(__u64 held_ts, __u64 held_rq, __u64 held_start,
					__u64 rq, __u64 start)
{
	if (held_ts && (held_rq != rq || held_start != start))
		emd_count_drop(&drops, BLOCKIO_DROP_COMPLETE_UNSEEN);
}

static __always_inline int on_issue(void *ctx, struct request *rq, bool raw)
{
	struct blockio_stamp st = { .ts = bpf_ktime_get_ns() }, *held;
	__u64 key = (__u64)rq;
	__u32 tag = EMD_READ(raw, rq, tag), slot, i;
	struct blockio_queue *q;

	st.start = EMD_READ(raw, rq, start_time_ns);
	if (emd_by_cgroup)
		st.issuer = bpf_get_current_cgroup_id();
	/* with `slow`: the issuing task, sent with the request if it proves slow */
	emd_slow_start(ctx, key, &drops, BLOCKIO_DROP_SLOW_ORIGIN_FULL);
	if (tag < BLOCKIO_TAGS) {
		q = queue_of(rq, raw, true, &slot);
		if (q) {
			i = tag_index(tag);
			stale_stamp(q->ts[i], q->rq[i], q->start[i], key, st.start);
			q->rq[i] = key;
			q->start[i] = st.start;
			q->ts[i] = st.ts;
			if (emd_by_cgroup)
				q->issuer[i] = st.issuer;
			return 0;
		}
	}
	held = bpf_map_lookup_elem(&issued, &key);
	if (held) {
		stale_stamp(held->ts, key, held->start, key, st.start);
		held->ts = st.ts;
		held->issuer = st.issuer;
		held->start = st.start;
		return 0;
	}
	read_disk_name(request_disk(rq, raw), st.disk);
	if (bpf_map_update_elem(&issued, &key, &st, BPF_ANY))
		emd_count_drop(&drops, BLOCKIO_DROP_IN_FLIGHT_FULL);
	return 0;
}

/*
 * A request completed that was never issued to the device: the request of a
 * flush sequence (an fsync's empty REQ_PREFLUSH write, a write with FUA on a disk
 * without it), which the kernel ends after the flush request it stood for (that
 * one is counted, op flush). Still idle (never started), it is no I/O of its own,
 * and not a completion whose issue was missed.
 */
static __always_inline bool never_started(struct request *rq, bool raw)
{
	return EMD_READ(raw, rq, state) == MQ_RQ_IDLE;
}

static __always_inline int on_complete(struct request *rq,
				       unsigned int nr_bytes, bool raw)
{
	struct blockio_key key = {};
	struct blockio_value *v = NULL;
	__u64 cgroup = 0;
	struct blockio_stamp *stamp;
	struct blockio_queue *q;
	__u64 rqkey = (__u64)rq, *ts, delta, issuer = 0;
	__u32 op, tag, slot;

	op = EMD_READ(raw, rq, cmd_flags) & REQ_OP_MASK;
	op = op <= BLOCKIO_OP_DISCARD ? op : BLOCKIO_OP_OTHER;
	tag = EMD_READ(raw, rq, tag);
	q = tag < BLOCKIO_TAGS ? queue_of(rq, raw, false, &slot) : NULL;
	if (q) {
		ts = &q->ts[tag_index(tag)];
		if (!*ts) {
			/* issued before we attached, or its issue was not seen */
			if (!never_started(rq, raw))
				emd_count_drop(&drops, BLOCKIO_DROP_ISSUE_UNSEEN);
			return 0;
		}
		delta = bpf_ktime_get_ns() - *ts;
		*ts = 0;
		if (emd_by_cgroup || emd_slow_threshold_ns)
			__builtin_memcpy(key.disk, q->disk, sizeof(key.disk));
		if (emd_by_cgroup) {
			issuer = q->issuer[tag_index(tag)];
		} else {
			slot = slot * BLOCKIO_OPS + op;
			v = bpf_map_lookup_elem(&slot_series, &slot);
		}
	} else {
		stamp = bpf_map_lookup_elem(&issued, &rqkey);
		if (!stamp) {
			if (!never_started(rq, raw))
				emd_count_drop(&drops, BLOCKIO_DROP_ISSUE_UNSEEN);
			return 0;
		}
		delta = bpf_ktime_get_ns() - stamp->ts;
		issuer = stamp->issuer;
		bpf_map_delete_elem(&issued, &rqkey);
		read_disk_name(request_disk(rq, raw), key.disk);
		if (!emd_by_cgroup) {
			key.op = op;
			v = emd_lookup_or_init(&series, &key, &zero_value, &drops,
					       BLOCKIO_DROP_SERIES_FULL);
		}
	}
	if (emd_by_cgroup) {
		struct blockio_cgroup_key ck = {};

		ck.cgroup = request_cgroup(rq, issuer, raw);
		cgroup = ck.cgroup;
		__builtin_memcpy(ck.disk, key.disk, sizeof(ck.disk));
		ck.op = op;
		v = emd_lookup_or_init(&series_by_cgroup, &ck, &zero_value, &drops,
				       BLOCKIO_DROP_LABELS_FULL);
	}
	if (v) {
		emd_hist_add_ns(v, delta);
		v->bytes += nr_bytes;
	}
	/* after the count: an exemplar is set on a bucket that holds its event */
	emd_slow_end(rqkey, delta, v != NULL, op, key.disk, cgroup, &drops,
		     BLOCKIO_DROP_SLOW_LIMITED, BLOCKIO_DROP_SLOW_RING_FULL);
	return 0;
}

/*
 * A request handed back to be issued again: its stamp is taken out, so that the
 * tag it leaves is not taken for one whose completion went unseen. With an I/O
 * scheduler the kernel has already let its driver tag go, so the stamp is found
 * among its queue's by its struct request, which no other request in flight has
 * (a rare path: the driver was busy).
 */
static __always_inline int on_requeue(struct request *rq, bool raw)
{
	__u32 tag = EMD_READ(raw, rq, tag), slot, i;
	__u64 key = (__u64)rq;
	struct blockio_queue *q;

	bpf_map_delete_elem(&issued, &key);
	q = queue_of(rq, raw, false, &slot);
	if (!q)
		return 0;
	if (tag < BLOCKIO_TAGS && q->rq[tag_index(tag)] == key) {
		q->ts[tag_index(tag)] = 0;
		return 0;
	}
	for (i = 0; i < BLOCKIO_TAGS; i++) {
		if (q->ts[i & (BLOCKIO_TAGS - 1)] && q->rq[i & (BLOCKIO_TAGS - 1)] == key) {
			q->ts[i & (BLOCKIO_TAGS - 1)] = 0;
			break;
		}
	}
	return 0;
}

#define ISSUE(raw) on_issue(ctx, rq, raw)
#define REQUEUE(raw) on_requeue(rq, raw)
#define COMPLETE(raw) on_complete(rq, nr_bytes, raw)

EMD_TP_PROGS(block_rq_issue, block_rq_issue, ISSUE, struct request *rq)
/* before 5.11: block_rq_issue(struct request_queue *q, struct request *rq) */
EMD_TP_PROGS(block_rq_issue, block_rq_issue_q, ISSUE, void *q, struct request *rq)
EMD_TP_PROGS(block_rq_requeue, block_rq_requeue, REQUEUE, struct request *rq)
/* before 5.11: block_rq_requeue(struct request_queue *q, struct request *rq) */
EMD_TP_PROGS(block_rq_requeue, block_rq_requeue_q, REQUEUE, void *q, struct request *rq)
EMD_TP_PROGS(block_rq_complete, block_rq_complete, COMPLETE, struct request *rq,
	     int error, unsigned int nr_bytes)

EMD_SLOW_RETURN_PROGS(slow, &drops, BLOCKIO_DROP_SLOW_RING_FULL)

char LICENSE[] SEC("license") = "GPL";
