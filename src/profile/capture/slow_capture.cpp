#include "ebpf_metricsd/profile/slow_capture.h"

#include <linux/types.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include <bit>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "ebpf_metricsd/base/clock.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_reader.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/profile/profiles.h"

// clang-format off
#include "common/slow.h"
#include "common/stacks.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

// Events and their frames waiting for the drain; more (a drain that does not come) are
// counted and dropped.
constexpr std::size_t kMaxPending = 10000;
constexpr std::size_t kMaxPendingFrames = 200000;

double realtime_of(std::uint64_t monotonic_ns) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  const double now_mono =
      static_cast<double>(mono.tv_sec) + static_cast<double>(mono.tv_nsec) * 1e-9;
  const double now_real =
      static_cast<double>(real.tv_sec) + static_cast<double>(real.tv_nsec) * 1e-9;
  return now_real - (now_mono - static_cast<double>(monotonic_ns) * 1e-9);
}

// The stacks an object could not keep whole (bpf/common/stacks.bpf.h, which slow events and
// the profile share) and the slow events it could not hold for their return
// (bpf/common/slow_return.bpf.h).
const SharedDrops stack_drops("emd_stack_drops",
                              drop_reasons<EMD_STACK_DROP__COUNT>({"stack_error", "stack_truncated",
                                                                   "stack_collision",
                                                                   "stack_not_kept"}));
const SharedDrops slow_return_drops(
    "emd_slow_return_drops",
    drop_reasons<EMD_SLOW_RETURN__COUNT>({"slow_return_mismatch", "slow_return_exited",
                                          "slow_return_full", "slow_return_exec",
                                          "slow_return_second"}));

}  // namespace

SlowOptions SlowOptions::read(YamlMapReader& options) {
  SlowOptions o;
  if (!options.has("slow")) return o;
  YamlMapReader slow = options.get_map("slow");
  if (!slow.has("threshold")) slow.fail("", "slow needs a threshold (e.g. threshold: 10ms)");
  const std::string threshold = slow.get_string("threshold", "");
  try {
    o.threshold_ns = parse_nanoseconds(threshold);
  } catch (const std::invalid_argument& e) {
    slow.fail("threshold", e.what());
  }
  if (o.threshold_ns < 1000 || o.threshold_ns > 3600ULL * 1000000000ULL) {
    slow.fail("threshold", "must be from 1us to 1h");
  }
  o.max_per_second =
      static_cast<std::uint32_t>(slow.get_int("max_per_second", o.max_per_second, 1, 1000));
  o.lines = slow.get_bool("lines", o.lines);
  const std::string unwind = slow.get_string("unwind", "cfi");
  if (unwind != "cfi" && unwind != "frame_pointers") {
    slow.fail("unwind", "must be cfi or frame_pointers");
  }
  o.unwind_cfi = unwind == "cfi";
  slow.finish();
  return o;
}

std::uint32_t SlowOptions::ring_bytes() const {
  // The reading thread empties it every 100 ms; two seconds leave room for a stall.
  const std::uint64_t want = std::uint64_t{2} * max_per_second * sizeof(emd_slow_event);
  return static_cast<std::uint32_t>(
      std::min<std::uint64_t>(std::bit_ceil(std::max<std::uint64_t>(want, 65536)), 8u << 20));
}

// An event as it arrived, without its stacks: `frames` holds them named.
struct SlowCapture::Pending {
  std::uint64_t ts, latency_ns, cgroup, key;
  std::uint32_t tgid, tid, slot;
  bool at_start;
  std::string comm, label;
  std::vector<profiling::Frame> frames;
};

std::uint32_t SlowCapture::self_tgid() { return static_cast<std::uint32_t>(getpid()); }

std::uint32_t SlowCapture::kept_stacks() { return lru_map_entries(4096); }

SlowCapture::SlowCapture(MetricScope& scope, MetricScope::Metric metric, std::string metric_name,
                         SlowOptions options, CgroupLabels& labels, profiling::Profiles* stacks,
                         profiling::Walker* walker)
    : scope_(scope),
      metric_(metric),
      metric_name_(std::move(metric_name)),
      options_(options),
      labels_(labels),
      own_stacks_(stacks ? nullptr : std::make_unique<profiling::Profiles>()),
      stacks_(stacks ? stacks : own_stacks_.get()),
      walker_(walker) {
  if (walks()) {
    unwinds_metric_ = scope_.declare(
        {"ebpf_metricsd_slow_unwinds_total",
         "User stacks of slow events walked in the kernel with the unwind tables, by tracer and "
         "how the walk ended: complete, or cut (the frames found are kept, and a last frame "
         "says why).",
         MetricType::Counter,
         {"tracer", "result"}});
    for (std::uint32_t end = 0; end < EMD_UNWIND_END__COUNT; ++end) {
      scope_.add(*unwinds_metric_, {scope_.tracer(), std::string(profiling::walk_end_name(end))},
                 0);
    }
  }
}

SlowCapture::~SlowCapture() {
  reader_.stop();
  if (own_walker_) stacks_->symbolizer().set_file_source(nullptr);
}

profiling::ProcessManager& SlowCapture::walker() const {
  if (walker_) return walker_->get();
  if (!own_walker_) own_walker_ = std::make_unique<profiling::Walker>();
  return own_walker_->get();
}

void SlowCapture::hold_from(bpf_map* held, bpf_map* stacks, __u64* swept) {
  if (!options_.on() || !options_.unwind_cfi) return;
  held_ = held;
  held_stacks_ = stacks;
  swept_ = swept;
  scope_.add_dropped("slow_return_late", 0);
}

void SlowCapture::sweep_held() {
  if (!held_) return;
  const int fd = bpf_map__fd(held_);
  const std::uint64_t now = monotonic_ns();
  const std::uint64_t max_hold = std::chrono::nanoseconds(kMaxHold).count();
  // Through read_map: a stand-in's table where one is set (unit tests).
  const std::vector<__u32> tids = read_map(held_)->keys<__u32>(bpf_map__max_entries(held_));
  // The stack kept under hash `id` (0: none), or nullopt where it is gone.
  const auto stack_of = [&](__u64 id) -> std::optional<std::vector<std::uint64_t>> {
    if (!id) return std::vector<std::uint64_t>{};
    emd_stack st;
    if (id == EMD_STACK_NOT_KEPT || bpf_map_lookup_elem(bpf_map__fd(held_stacks_), &id, &st) != 0 ||
        st.nr > EMD_STACK_MAX_DEPTH)
      return std::nullopt;
    return std::vector<std::uint64_t>(st.ips, st.ips + st.nr);
  };
  for (__u32 tid : tids) {
    emd_slow_held h;
    // Taken only if this delete is the one that succeeds: else its thread took it.
    if (bpf_map_lookup_elem(fd, &tid, &h) != 0 || now <= h.ts || now - h.ts < max_hold ||
        bpf_map_delete_elem(fd, &tid) != 0)
      continue;
    __atomic_fetch_add(swept_, 1, __ATOMIC_RELAXED);
    ++late_;
    const auto kernel = stack_of(h.origin.kstack);
    const auto user = stack_of(h.origin.ustack);
    if (!kernel || !user) {
      std::lock_guard lock(mutex_);
      ++stack_lost_;
      continue;
    }
    Pending p{h.ts,
              h.latency_ns,
              h.cgroup,
              h.key,
              h.origin.tgid,
              h.origin.tid,
              h.slot,
              /*at_start=*/true,
              std::string(h.origin.comm, strnlen(h.origin.comm, sizeof h.origin.comm)),
              std::string(h.label, strnlen(h.label, sizeof h.label)),
              stacks_->symbolizer().frames(h.origin.tgid, *kernel, *user,
                                           profiling::StackOrigin::Call, options_.lines, h.ts)};
    std::lock_guard lock(mutex_);
    if (pending_.size() >= kMaxPending || pending_frames_ + p.frames.size() > kMaxPendingFrames) {
      ++pending_dropped_;
      continue;
    }
    pending_frames_ += p.frames.size();
    pending_.push_back(std::move(p));
  }
}

void SlowCapture::start(bpf_map* map) {
  if (!options_.on()) return;
  reader_ = RingReader(
      map, [this](std::span<const std::byte> record) { on_event(record); }, "slow events");
}

void SlowCapture::on_event(std::span<const std::byte> record) {
  if (record.size() < sizeof(emd_slow_event)) return;
  emd_slow_event copy;
  std::memcpy(&copy, record.data(), sizeof copy);
  const emd_slow_event* e = &copy;
  if (e->kstack_len == EMD_SLOW_STACK_LOST || e->ustack_len == EMD_SLOW_STACK_LOST) {
    // Its stack was evicted between the event's start and end: not kept (all such events
    // would share the id of an empty stack), counted.
    std::lock_guard lock(mutex_);
    ++stack_lost_;
    return;
  }
  auto frames_of = [](const __u64* ips, __s32 len) {
    const std::size_t n =
        len > 0 ? std::min<std::size_t>(static_cast<std::size_t>(len) / 8, EMD_SLOW_MAX_DEPTH) : 0;
    return std::span<const std::uint64_t>(reinterpret_cast<const std::uint64_t*>(ips), n);
  };
  Pending p{e->ts,
            e->latency_ns,
            e->cgroup,
            e->key,
            e->tgid,
            e->tid,
            e->slot,
            e->taken == EMD_SLOW_TAKEN_AT_START,
            std::string(e->comm, strnlen(e->comm, sizeof e->comm)),
            std::string(e->label, strnlen(e->label, sizeof e->label)),
            {}};
  // Taken at its start, no later than it ended; or at its return (walked, or by frame
  // pointer).
  p.frames = stacks_->symbolizer().frames(e->tgid, frames_of(e->kstack, e->kstack_len),
                                          frames_of(e->ustack, e->ustack_len),
                                          profiling::StackOrigin::Call, options_.lines,
                                          e->taken == EMD_SLOW_TAKEN_AT_START ? e->ts : 0);
  std::lock_guard lock(mutex_);
  if (pending_.size() >= kMaxPending || pending_frames_ + p.frames.size() > kMaxPendingFrames) {
    ++pending_dropped_;
    return;
  }
  pending_frames_ += p.frames.size();
  pending_.push_back(std::move(p));
}

void SlowCapture::begin_drain() {
  sweep_held();
  std::lock_guard lock(mutex_);
  for (Pending& p : pending_) taken_.push_back(std::move(p));
  pending_.clear();
  pending_frames_ = 0;
  taken_dropped_ += std::exchange(pending_dropped_, 0);
  taken_lost_ += std::exchange(stack_lost_, 0);
}

void SlowCapture::drain(
    const std::function<MetricStore::LabelValues(std::uint64_t key, std::string_view label)>&
        series,
    const std::vector<std::string>& names) {
  std::deque<Pending> arrived;
  arrived.swap(taken_);
  if (const std::uint64_t dropped = std::exchange(taken_dropped_, 0)) {
    scope_.add_dropped("slow_queue_full", dropped);
  }
  if (const std::uint64_t lost = std::exchange(taken_lost_, 0)) {
    scope_.add_dropped("slow_stack_lost", lost);
  }
  if (const std::uint64_t late = std::exchange(late_, 0)) {
    scope_.add_dropped("slow_return_late", late);
  }
  if (unwinds_metric_ && walk_ends_) {
    const profiling::WalkEnds ended = profiling::walk_ends_since(walk_ends_, walk_ends_seen_);
    for (std::uint32_t end = 0; end < EMD_UNWIND_END__COUNT; ++end) {
      scope_.add(*unwinds_metric_, {scope_.tracer(), std::string(profiling::walk_end_name(end))},
                 ended[end]);
    }
  }
  profiling::SlowEventStore& store = stacks_->slow_events();
  store.expire_old();
  for (Pending& p : arrived) {
    profiling::SlowEvent e;
    e.metric = metric_name_;
    MetricStore::LabelValues values = series(p.key, p.label);
    for (std::size_t i = 0; i < values.size() && i < names.size(); ++i) {
      e.series.emplace_back(names[i], values[i]);
    }
    e.latency_ns = p.latency_ns;
    e.pid = p.tgid;
    e.tid = p.tid;
    e.comm = p.comm;
    e.stack_at_start = p.at_start;
    const double when = realtime_of(p.ts);
    e.when = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(when)));
    if (labels_.on()) {
      e.workload = labels_.label(p.cgroup);
      labels_.append(values, p.cgroup);
    }
    Exemplar x;
    x.value = static_cast<double>(p.latency_ns) * 1e-9;
    x.timestamp = when;
    x.labels = {{"stack_id", ""}, {"pid", std::to_string(p.tgid)}, {"comm", e.comm}};
    const std::size_t slot = p.slot;
    const std::uint64_t id = store.keep(std::move(e), std::move(p.frames));
    x.labels[0].second = profiling::stack_id_text(id);
    scope_.set_exemplar(metric_, values, slot, std::move(x));
  }
}

}  // namespace ebpf_metricsd
