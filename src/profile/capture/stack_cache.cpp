#include "stack_cache.h"

#include <bpf/bpf.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>

#include "ebpf_metricsd/bpf/map_reader.h"

// clang-format off
#include <linux/types.h>
#include "common/stacks.h"
// clang-format on

namespace ebpf_metricsd::profiling {

namespace {
constexpr std::chrono::minutes kRawStackLife{10};
}  // namespace

void StackCache::read(const bpf_map* stacks, Clock::time_point now) {
  ++generation_;
  const int fd = bpf_map__fd(stacks);
  read_map_fd(fd, false)->take_each<__u64, emd_stack>(
      bpf_map__max_entries(stacks), [&](const __u64 k, const emd_stack& s) {
        auto [at, fresh] = raw_.try_emplace(k);
        RawStack& r = at->second;
        // Another stack under a hash read before (the kernel side compares within what it
        // holds, which each read empties): the newer is what samples from now on mean.
        if (!fresh && r.check != s.check) {
          ++collisions_;
          // Before the batch takes views of the caches (the stacks are read first).
          std::erase_if(kernel_cache_, [k](const auto& kv) { return kv.first.first == k; });
          std::erase_if(user_cache_, [k](const auto& kv) { return kv.first.second == k; });
        }
        r.ips.assign(s.ips, s.ips + std::min<__u32>(s.nr, EMD_STACK_MAX_DEPTH));
        r.check = s.check;
        r.seen = now;
      });
}

const StackCache::RawStack* StackCache::raw_stack(std::uint64_t hash) {
  auto it = raw_.find(hash);
  if (it == raw_.end()) return nullptr;
  it->second.seen = Clock::now();
  return &it->second;
}

const std::vector<Frame>* StackCache::kernel_frames(std::uint64_t hash, bool off_cpu) {
  static const std::vector<Frame> none;
  if (hash == 0) return &none;
  const auto key = std::make_pair(hash, off_cpu);
  auto it = kernel_cache_.find(key);
  if (it == kernel_cache_.end()) {
    const RawStack* r = raw_stack(hash);
    if (!r) return nullptr;
    const StackOrigin origin = off_cpu ? StackOrigin::Call : StackOrigin::Interrupt;
    it = kernel_cache_.emplace(key, Cached{symbolizer_.kernel_frames(r->ips, origin), 0}).first;
  }
  it->second.seen = generation_;
  return &it->second.frames;
}

const std::vector<Frame>* StackCache::user_frames(std::uint32_t tgid, std::uint64_t hash) {
  static const std::vector<Frame> none;
  if (hash == 0) return &none;
  const auto key = std::make_pair(tgid, hash);
  auto it = user_cache_.find(key);
  if (it == user_cache_.end()) {
    const RawStack* r = raw_stack(hash);
    if (!r) return nullptr;
    it = user_cache_.emplace(key, Cached{symbolizer_.user_frames(tgid, r->ips, lines_), 0}).first;
  }
  it->second.seen = generation_;
  return &it->second.frames;
}

void StackCache::forget_unused() {
  const std::uint64_t keep_from = generation_ > 3 ? generation_ - 3 : 0;
  std::erase_if(kernel_cache_, [&](const auto& kv) { return kv.second.seen < keep_from; });
  // A process's named stacks serve its later samples; once it has exited (its last ones
  // read by this cut), they serve none: 2,000 short processes would otherwise hold theirs
  // for three cuts.
  std::unordered_map<std::uint32_t, bool> gone;
  const auto exited = [&](std::uint32_t tgid) {
    auto [at, fresh] = gone.try_emplace(tgid, false);
    if (fresh) at->second = kill(static_cast<pid_t>(tgid), 0) != 0 && errno == ESRCH;
    return at->second;
  };
  std::erase_if(user_cache_, [&](const auto& kv) {
    return kv.second.seen < keep_from || exited(kv.first.first);
  });
  const auto too_old = Clock::now() - kRawStackLife;
  std::erase_if(raw_, [&](const auto& kv) { return kv.second.seen < too_old; });
  const std::size_t cap = std::size_t{max_stacks_} * 4;
  if (raw_.size() > cap) {
    std::vector<Clock::time_point> seen;
    seen.reserve(raw_.size());
    for (const auto& [hash, r] : raw_) seen.push_back(r.seen);
    auto nth = seen.begin() + static_cast<std::ptrdiff_t>(raw_.size() - cap);
    std::nth_element(seen.begin(), nth, seen.end());
    const auto cutoff = *nth;
    std::erase_if(raw_, [&](const auto& kv) { return kv.second.seen < cutoff; });
  }
}

StackCache::Held StackCache::held() const {
  // A std::map's node holding `key` and `value`: four pointers and the colour beside the
  // entry, and the heap of the named frames it keeps.
  const auto map_node_bytes = [](const auto& key, const auto& value,
                                 const std::vector<Frame>& frames) {
    return sizeof(key) + sizeof(value) + 5 * sizeof(void*) + frames_bytes(frames);
  };
  Held h;
  h.stacks = raw_.size();
  // An unordered_map's node and bucket: three pointers beside the entry.
  h.stack_bytes = raw_.size() * (sizeof(RawStack) + sizeof(std::uint64_t) + 3 * sizeof(void*));
  for (const auto& [hash, r] : raw_) h.stack_bytes += r.ips.capacity() * sizeof(std::uint64_t);
  for (const auto& [key, c] : kernel_cache_) h.frame_bytes += map_node_bytes(key, c, c.frames);
  for (const auto& [key, c] : user_cache_) h.frame_bytes += map_node_bytes(key, c, c.frames);
  return h;
}

}  // namespace ebpf_metricsd::profiling
