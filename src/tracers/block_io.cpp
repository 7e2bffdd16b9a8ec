// block_io: block request latency (issue to complete) and bytes, by disk and operation.
#include <array>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <bpf/bpf.h>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/map_reader.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/slow_capture.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "ebpf_metricsd/tracers/tracer_options.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "block_io.h"
#include "block_io.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(block_io);

const char* op_name(std::uint32_t op) {
  switch (op) {
    case BLOCKIO_OP_READ:
      return "read";
    case BLOCKIO_OP_WRITE:
      return "write";
    case BLOCKIO_OP_FLUSH:
      return "flush";
    case BLOCKIO_OP_DISCARD:
      return "discard";
    default:
      return "other";
  }
}

class BlockIoTracer final : public Tracer {
 public:
  using Options = OwnedHistogramOptions;
  BlockIoTracer(MetricScope& scope, const OwnedHistogramOptions& options,
                const TracerContext& context)
      : scope_(scope),
        labels_(options.cgroup),
        latency_(scope.declare(labels_.with_labels(
            {"ebpf_block_io_latency_seconds",
             "Block request latency, from issue to the device until completion, by disk and "
             "operation.",
             MetricType::Histogram,
             {"device", "op"},
             options.buckets}))),
        bytes_(scope.declare(
            labels_.with_labels({"ebpf_block_io_bytes_total",
                                 "Bytes completed by block requests, by disk and operation.",
                                 MetricType::Counter,
                                 {"device", "op"}}))),
        drops_(scope,
               drop_reasons<BLOCKIO_DROP__COUNT>({"map_full", "map_full", "issue_unseen",
                                                  "map_full", "slow_limited", "slow_ring_full",
                                                  "slow_origin_full", "complete_unseen"}),
               "never_completed"),
        slow_(scope, latency_, "ebpf_block_io_latency_seconds", options.slow, labels_,
              context.profiles, context.walker),
        in_flight_(scope.declare({"ebpf_block_io_requests_in_flight",
                                  "Requests issued whose completion the tracer has not seen "
                                  "yet, by disk: the device's own in-flight count, unless a "
                                  "completion was missed (see complete_unseen).",
                                  MetricType::Gauge,
                                  {"device"}})) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 5> tps = {"block_rq_issue", "block_rq_complete",
                                                   "block_rq_requeue", "sys_exit",
                                                   "sched_process_exit"};
    // block_rq_issue(rq) since 5.11, block_rq_issue(q, rq) before: ask the kernel's BTF.
    const auto args = tracepoint_arg_count("block_rq_issue");
    const bool with_queue = args && *args == 2;
    const auto requeue_args = tracepoint_arg_count("block_rq_requeue");
    const bool requeue_with_queue = requeue_args && *requeue_args == 2;
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tps, preference,
        [this, with_queue, requeue_with_queue](block_io* s, HookKind) {
          s->rodata->emd_by_cgroup = labels_.on();
          bpf_map__set_max_entries(s->maps.series_by_cgroup,
                                   labels_.options().kernel_map_entries());
          slow_.configure(s, BLOCKIO_MAX_IN_FLIGHT);
          auto& p = s->progs;
          // Held events' senders first: a mark is never left unread.
          std::vector<HookTwin> hooks = slow_return_hooks(s, slow_.options());
          // Completions before issues: a request issued while the tracer attaches is then
          // either unstamped (issue_unseen at its completion) or seen at both ends, never
          // stamped with its completion unseen (complete_unseen).
          hooks.insert(hooks.end(),
                       {
                           {p.block_rq_complete_btf, p.block_rq_complete_raw},
                           {p.block_rq_requeue_btf, p.block_rq_requeue_raw, !requeue_with_queue},
                           {p.block_rq_requeue_q_btf, p.block_rq_requeue_q_raw, requeue_with_queue},
                           {p.block_rq_issue_btf, p.block_rq_issue_raw, !with_queue},
                           {p.block_rq_issue_q_btf, p.block_rq_issue_q_raw, with_queue},
                       });
          return hooks;
        });
    slow_.start(skel_.get());
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(blockio_value) == (BLOCKIO_SLOTS + 2) * 8);
    slow_.begin_drain();
    read_slots();
    // The same value in three maps: by cgroup when labelled, else by queue slot, and by
    // name for the disks past the slots.
    if (labels_.on()) {
      labels_.drain<blockio_cgroup_key>(
          cgroup_series_, skel_->maps.series_by_cgroup, [](const blockio_cgroup_key& k) {
            return MetricStore::LabelValues{fixed_name(k.disk), op_name(k.op)};
          });
    }
    slot_series_.drain_array(
        skel_->maps.slot_series, BLOCKIO_QUEUE_SLOTS * BLOCKIO_OPS, [&](const void* key) {
          const auto k = *static_cast<const std::uint32_t*>(key);
          return MetricStore::LabelValues{slot_disk(k / BLOCKIO_OPS), op_name(k % BLOCKIO_OPS)};
        });
    series_.drain_hash(skel_->maps.series, sizeof(blockio_key), [](const void* key) {
      const auto* k = static_cast<const blockio_key*>(key);
      return MetricStore::LabelValues{fixed_name(k->disk), op_name(k->op)};
    });
    static const std::vector<std::string> names = {"device", "op"};
    slow_.drain(
        [](std::uint64_t op, std::string_view disk) {
          return MetricStore::LabelValues{std::string(disk),
                                          op_name(static_cast<std::uint32_t>(op))};
        },
        names);
    drops_.drain();
    count_in_flight();
    // A request that has not completed in 10 minutes never will (its disk is gone): its
    // stamp is removed so the in-flight map cannot fill up with them.
    drops_.sweep(skel_->maps.issued, std::chrono::minutes(10));
  }

 private:
  // The stamps held, by disk: in the claimed queue slots and in the hash. A disk seen
  // before and holding none now reads 0.
  void count_in_flight() {
    std::map<std::string, std::uint64_t> held;
    for (const auto& [disk, n] : in_flight_seen_) held[disk] = 0;
    for (const blockio_queue& q : slots_) {
      if (!q.hctx) continue;
      std::uint64_t& n = held[fixed_name(q.disk)];
      for (const __u64 ts : q.ts) n += ts != 0;
    }
    if (!issued_) issued_ = read_map(skel_->maps.issued);
    // A completion deletes its key meanwhile, and the kernel's walk then starts again from
    // the first: each key counted once, the walk bounded by the map's size.
    std::set<__u64> seen;
    __u64 key = 0;
    blockio_stamp st{};
    const __u64* prev = nullptr;
    for (std::uint32_t i = 0; i < BLOCKIO_MAX_IN_FLIGHT && issued_->next_key(prev, &key); ++i) {
      if (seen.insert(key).second && issued_->lookup(&key, &st)) ++held[fixed_name(st.disk)];
      prev = &key;
    }
    for (const auto& [disk, n] : held) scope_.set(in_flight_, {disk}, static_cast<double>(n));
    in_flight_seen_ = std::move(held);
  }

  // The queue slots, read once a drain: their disks name the slot series, their stamps
  // are the requests in flight. A slot that cannot be read counts as free.
  void read_slots() {
    if (!queues_) queues_ = read_map(skel_->maps.queues);
    for (std::uint32_t slot = 0; slot < BLOCKIO_QUEUE_SLOTS; ++slot) {
      if (!queues_->lookup(&slot, &slots_[slot])) slots_[slot] = blockio_queue{};
    }
  }

  // The disk's name is kept with the queue slot; a slot claimed since the drain read the
  // slots is read again.
  std::string slot_disk(std::uint32_t slot) {
    if (slot >= slots_.size()) throw BpfError("block_io: no queue slot " + std::to_string(slot));
    if (!slots_[slot].hctx && !queues_->lookup(&slot, &slots_[slot]))
      throw BpfError("block_io: no queue slot " + std::to_string(slot));
    return fixed_name(slots_[slot].disk);
  }

  MetricScope& scope_;
  CgroupLabels labels_;
  MetricScope::Metric latency_, bytes_;
  // Its value: {latency slots, sum of ns, bytes}.
  SeriesDrain series_{scope_, {{latency_, BLOCKIO_SLOTS}, {bytes_}}};
  SeriesDrain slot_series_{scope_, {{latency_, BLOCKIO_SLOTS}, {bytes_}}};
  SeriesDrain cgroup_series_{scope_, {{latency_, BLOCKIO_SLOTS}, {bytes_}}};
  DropAccounting drops_;
  SlowCapture slow_;
  Object skel_;
  MetricScope::Metric in_flight_;
  std::map<std::string, std::uint64_t> in_flight_seen_;
  std::unique_ptr<MapReader> queues_;  // of skel_'s queue slots
  std::vector<blockio_queue> slots_ = std::vector<blockio_queue>(BLOCKIO_QUEUE_SLOTS);
  std::unique_ptr<MapReader> issued_;  // of skel_'s in-flight hash
};

}  // namespace

TracerDescriptor block_io_descriptor() {
  // 8us .. 16s: from a fast NVMe read to a disk that retries.
  return descriptor_with_owned_histogram<BlockIoTracer>(
      "block_io", "Block I/O latency and bytes, by disk and operation", Log2Layout::seconds(-17, 4),
      /*slow=*/true);
}

}  // namespace ebpf_metricsd
