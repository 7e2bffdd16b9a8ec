/* SPDX-License-Identifier: GPL-2.0 */
#ifndef EBPF_METRICSD_BLOCK_IO_H
#define EBPF_METRICSD_BLOCK_IO_H

#include "common/log2_slot.h"

/* Histogram slots: powers of two of seconds (common/log2_slot.h). */
#define BLOCKIO_SLOTS EMD_HIST_SLOTS
#define BLOCKIO_DISK_NAME_LEN 32
#define BLOCKIO_MAX_SERIES 4096 /* (queue slot or disk, op) pairs */
#define BLOCKIO_MAX_IN_FLIGHT 65536
/* Issue stamps by (hardware queue slot, driver tag) */
#define BLOCKIO_QUEUE_SLOTS 64 /* power of two */
#define BLOCKIO_QUEUE_PROBES 4 /* slots tried per hardware queue */
#define BLOCKIO_TAGS 256	/* power of two */
#define BLOCKIO_OPS 5

/* A hardware queue's slot: its stamps, and the name of its disk. */
struct blockio_queue {
	__u64 hctx;	/* struct blk_mq_hw_ctx * owning the slot, 0 = free */
	__u64 disk_ptr; /* struct gendisk * the name was read from */
	char disk[BLOCKIO_DISK_NAME_LEN];
	__u64 ts[BLOCKIO_TAGS];
	__u64 issuer[BLOCKIO_TAGS]; /* cgroup of the issuing task (`cgroup: true`) */
	/* which request each stamp is of: its struct request and its start_time_ns */
	__u64 rq[BLOCKIO_TAGS];
	__u64 start[BLOCKIO_TAGS];
};

/* A request in flight that has no queue slot. */
struct blockio_stamp {
	__u64 ts;
	__u64 issuer;
	__u64 start; /* the request's start_time_ns */
	char disk[BLOCKIO_DISK_NAME_LEN];
};

enum blockio_op {
	BLOCKIO_OP_READ = 0,
	BLOCKIO_OP_WRITE = 1,
	BLOCKIO_OP_FLUSH = 2,
	BLOCKIO_OP_DISCARD = 3,
	BLOCKIO_OP_OTHER = 4,
};

/* Series of requests that fell back to the per-request hash, by disk name.
 * Those stamped in a queue slot are keyed by slot * BLOCKIO_OPS + op. */
struct blockio_key {
	char disk[BLOCKIO_DISK_NAME_LEN];
	__u32 op;
};

/* With `cgroup: true`: every request's series by (cgroup, disk, op). */
struct blockio_cgroup_key {
	__u64 cgroup;
	char disk[BLOCKIO_DISK_NAME_LEN];
	__u32 op;
	__u32 pad;
};

struct blockio_value {
	__u64 slots[BLOCKIO_SLOTS];
	__u64 sum;   /* ns */
	__u64 bytes;
};

enum blockio_drop_reason {
	BLOCKIO_DROP_IN_FLIGHT_FULL = 0,
	BLOCKIO_DROP_SERIES_FULL = 1,
	BLOCKIO_DROP_ISSUE_UNSEEN = 2, /* completed, but no issue stamp to measure from */
	BLOCKIO_DROP_LABELS_FULL = 3, /* no room for another (cgroup, disk, op) */
	BLOCKIO_DROP_SLOW_LIMITED = 4,	  /* a slow request over slow.max_per_second */
	BLOCKIO_DROP_SLOW_RING_FULL = 5,  /* a slow request with no room in the ring */
	BLOCKIO_DROP_SLOW_ORIGIN_FULL = 6, /* no room for an issuer's stacks */
	/* issued, and its stamp found still there when its tag (or its struct request) was
	 * issued again for another request: the completion was not seen */
	BLOCKIO_DROP_COMPLETE_UNSEEN = 7,
	BLOCKIO_DROP__COUNT,
};

#endif
