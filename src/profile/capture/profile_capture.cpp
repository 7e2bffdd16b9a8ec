#include "ebpf_metricsd/profile/profile_capture.h"

#include <bpf/bpf.h>

#include <cerrno>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/map_reader.h"
#include "stack_cache.h"
#include "thread_accounting.h"

// clang-format off
#include <linux/types.h>
#include "common/stacks.h"
#include "profile.h"
// clang-format on

namespace ebpf_metricsd::profiling {

ProfileCapture::ProfileCapture(Profiles& profiles, const ProfileObject& object,
                               const Options& options, const std::atomic<bool>& abandoned)
    : profiles_(profiles),
      object_(object),
      options_(options),
      names_(options.cgroup ? std::make_unique<CgroupNames>() : nullptr),
      stacks_(
          std::make_unique<StackCache>(profiles.symbolizer(), options.lines, options.max_stacks)),
      threads_(std::make_unique<ThreadAccounting>(*stacks_, profiles.symbolizer(), names_.get(),
                                                  options.lines)),
      abandoned_(abandoned) {}

ProfileCapture::~ProfileCapture() = default;

void ProfileCapture::start() {
  std::lock_guard lock(mutex_);
  threads_->start(object_.iterator, object_.thread_ends);
}

void ProfileCapture::cut() {
  std::lock_guard lock(mutex_);
  if (abandoned_) return;
  // The batch ends now, and the next begins.
  const Clock::time_point end = Clock::now();
  const Clock::time_point begun = std::exchange(batch_begun_, end);
  // A wait that ends from now on and began before, or ends while the maps are swapped, is
  // marked so (profile_key.began). Then point the programs at the empty map; the update
  // returns once no program runs with the other one any more, so it is complete.
  const __u64 previous_begin = __atomic_load_n(object_.batch_begin_ns, __ATOMIC_ACQUIRE);
  __atomic_store_n(object_.batch_begin_ns, ns_of(end), __ATOMIC_RELEASE);
  __atomic_store_n(object_.batch_swapping, 1, __ATOMIC_SEQ_CST);
  const __u32 zero = 0;
  const bpf_map* full_map = object_.counts[active_];
  const int full = bpf_map__fd(full_map);
  active_ ^= 1;
  const int next = bpf_map__fd(object_.counts[active_]);
  const int swapped = bpf_map_update_elem(bpf_map__fd(object_.slot), &zero, &next, BPF_ANY);
  const int swap_errno = errno;
  __atomic_store_n(object_.batch_swapping, 0, __ATOMIC_RELEASE);
  if (swapped != 0) {
    active_ ^= 1;
    __atomic_store_n(object_.batch_begin_ns, previous_begin, __ATOMIC_RELEASE);
    batch_begun_ = begun;
    throw BpfError(bpf_error_text("profile: swap the aggregate maps", swap_errno));
  }
  // A wait from `began` to `ended`: within this batch, or spanning batches, whose windows
  // each take their part (Sample::began).
  const auto span = [&](Sample& s, std::uint64_t began, std::uint64_t ended) {
    if (began == 0 || (monotonic(began) >= begun && monotonic(ended) <= end)) return;
    s.began = monotonic(began);
    s.ended = monotonic(ended);
  };

  std::vector<std::pair<profile_key, profile_value>> entries;
  read_map_fd(full, false)
      ->take_each<profile_key, profile_value>(
          bpf_map__max_entries(full_map),
          [&](const profile_key& k, const profile_value& v) { entries.emplace_back(k, v); });
  // The threads now: before the stacks are read, for the kernel stacks of their waits.
  const std::vector<profile_thread> now = threads_->now();
  stacks_->read(object_.stacks, end);
  counts_.collisions += stacks_->take_collisions();

  std::vector<Sample> samples;
  samples.reserve(entries.size());
  // The stacks of the batch, viewing the cached frames; what no cache holds is kept in
  // `owned` until the batch is added.
  std::vector<StackView> stacks;
  std::deque<std::vector<Frame>> owned;
  std::map<std::tuple<std::uint32_t, __u64, __u64, __u32>, std::uint32_t> stack_index;
  std::vector<bool> expired;  // by stack index
  if (names_) names_->begin_pass();
  for (const auto& [k, v] : entries) {
    Sample s;
    s.pid = k.tgid;
    s.tid = k.tid;
    s.comm = fixed_name(k.comm);
    s.kind = k.kind == PROFILE_OFF_CPU ? SampleKind::OffCpu : SampleKind::OnCpu;
    s.syscall = k.syscall;
    s.count = v.count;
    s.ns = v.ns;
    span(s, k.began, v.ended);
    (s.kind == SampleKind::OnCpu ? counts_.on_cpu : counts_.off_cpu) += v.count;
    if (names_) s.workload = names_->label(k.cgroup);
    const auto [at, fresh] = stack_index.try_emplace({k.tgid, k.kstack, k.ustack, k.kind},
                                                     static_cast<std::uint32_t>(stacks.size()));
    if (fresh) {
      const std::vector<Frame>* kernel =
          stacks_->kernel_frames(k.kstack, s.kind == SampleKind::OffCpu);
      const std::vector<Frame>* user = stacks_->user_frames(k.tgid, k.ustack);
      // A stack the kernel side kept whose frames the daemon no longer has: a wait longer
      // than stacks are kept, or more stacks than max_stacks * 4 since. (One it did not keep,
      // EMD_STACK_NOT_KEPT, was counted where it was taken.)
      expired.push_back((!kernel && k.kstack != EMD_STACK_NOT_KEPT) ||
                        (!user && k.ustack != EMD_STACK_NOT_KEPT));
      StackView view;
      if (kernel) view.parts[0] = *kernel;
      if (user) view.parts[1] = *user;
      if (view.parts[0].empty() && view.parts[1].empty())
        view.parts[0] = kernel && user ? no_stack() : stack_not_kept();
      stacks.push_back(view);
    }
    s.stack = at->second;
    if (expired[at->second]) counts_.stacks_expired += v.count;
    samples.push_back(std::move(s));
  }
  std::optional<std::vector<ThreadTime>> accounting;
  std::vector<Sample> waiting;
  if (threads_->running()) accounting = threads_->account(now, waiting, stacks, owned);
  profiles_.store().add_viewed_batch(end, std::move(samples), stacks, std::move(accounting),
                                     std::move(waiting));
  stacks_->forget_unused();
}

ProfileCapture::Counts ProfileCapture::take_counts() {
  std::lock_guard lock(mutex_);
  return std::exchange(counts_, Counts{});
}

ProfileCapture::Held ProfileCapture::held() {
  std::lock_guard lock(mutex_);
  const StackCache::Held h = stacks_->held();
  return {h.stacks, h.stack_bytes, h.frame_bytes};
}

}  // namespace ebpf_metricsd::profiling
