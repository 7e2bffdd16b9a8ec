#include "ebpf_metricsd/profile/profile_store.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace ebpf_metricsd::profiling {

std::uint32_t ProfileStore::intern(const std::vector<Frame>& frames) {
  std::vector<std::uint32_t> ids;
  ids.reserve(frames.size());
  for (const Frame& f : frames) {
    auto [it, fresh] = frame_ids_.try_emplace(f, static_cast<std::uint32_t>(frames_.size()));
    if (fresh) frames_.push_back(f);
    ids.push_back(it->second);
  }
  auto [it, fresh] = stack_ids_.try_emplace(ids, static_cast<std::uint32_t>(stacks_.size()));
  if (fresh) stacks_.push_back(std::move(ids));
  return it->second;
}

void ProfileStore::share_out(Sample& s, Clock::time_point begin, Clock::time_point end) {
  const Clock::time_point to = std::max(s.ended, s.began);
  // ns x ns can pass 2^64: the product in 128 bits.
  __extension__ using Wide = unsigned __int128;
  const auto span = static_cast<Wide>((to - s.began).count());
  const auto part_of = [&](Clock::time_point from, Clock::time_point until) -> std::uint64_t {
    from = std::max(from, s.began);
    if (span == 0 || until <= from) return 0;
    return static_cast<std::uint64_t>(s.ns * static_cast<Wide>((until - from).count()) / span);
  };
  // A part of s's time as a sample of its own: the wait is counted where it ended.
  const auto part_sample = [&](std::uint64_t part) {
    Sample p = s;
    p.count = 0;
    p.ns = part;
    p.began = p.ended = {};
    return p;
  };
  std::uint64_t given = 0;
  // Before the oldest kept batch: gone with it.
  const Clock::time_point kept_from = batches_.empty() ? begin : batches_.front().begin;
  given += part_of(s.began, std::min(kept_from, begin));
  for (Batch& b : batches_) {
    if (b.end <= s.began) continue;
    const std::uint64_t part = part_of(b.begin, std::min(b.end, begin));
    if (part == 0) continue;
    b.samples.push_back(part_sample(part));
    ++samples_;
    given += part;
  }
  // After this batch (a wait that ended while it was being read): the next one's.
  if (const std::uint64_t later = part_of(end, to); later > 0) {
    carry_.push_back(part_sample(later));
    given += later;
  }
  s.ns -= std::min(given, s.ns);
  s.began = s.ended = {};
}

void ProfileStore::add_batch(Clock::time_point end, std::vector<Sample> samples,
                             const std::vector<std::vector<Frame>>& stacks) {
  for (const Sample& s : samples) {
    if (s.stack >= stacks.size()) throw std::out_of_range("profile sample without its stack");
  }
  std::lock_guard lock(mutex_);
  // The parts of waits the previous batch held that fell after its end.
  std::vector<Sample> carried = std::exchange(carry_, {});
  if (samples.size() > limits_.max_samples) {
    dropped_ += samples.size() - limits_.max_samples;
    samples.resize(limits_.max_samples);
  }
  std::vector<std::uint32_t> ids(stacks.size(), 0);
  std::vector<char> interned(stacks.size(), 0);
  for (Sample& s : samples) {
    if (!interned[s.stack]) {
      ids[s.stack] = intern(stacks[s.stack]);
      interned[s.stack] = 1;
    }
    s.stack = ids[s.stack];
    if (s.began != Clock::time_point{}) share_out(s, last_end_, end);
  }
  samples.insert(samples.end(), std::make_move_iterator(carried.begin()),
                 std::make_move_iterator(carried.end()));
  // Every read is a batch, an empty one too: the waits that span it are shared out to it.
  samples.shrink_to_fit();  // kept for minutes: no room to grow
  samples_ += samples.size();
  batches_.push_back({last_end_, end, std::move(samples)});
  last_end_ = end;
  expire(end);
}

void ProfileStore::set_limits(Limits limits) {
  std::lock_guard lock(mutex_);
  limits_ = limits;
  expire(Clock::now());
}

ProfileStore::Limits ProfileStore::limits() const {
  std::lock_guard lock(mutex_);
  return limits_;
}

void ProfileStore::set_source(std::function<void()> cut) {
  std::lock_guard lock(source_mutex_);
  running_ = static_cast<bool>(cut);
  source_ = std::move(cut);
}

bool ProfileStore::cut() {
  std::lock_guard lock(source_mutex_);
  if (!source_) return false;
  source_();
  return true;
}

void ProfileStore::expire(Clock::time_point now) {
  // The newest batch stays; older ones go after the retention, or, oldest first, while
  // all together hold more than max_samples.
  bool removed = false;
  while (batches_.size() > 1 &&
         (batches_.front().end + limits_.retention < now || samples_ > limits_.max_samples)) {
    samples_ -= batches_.front().samples.size();
    batches_.pop_front();
    removed = true;
  }
  if (removed) compact();
}

void ProfileStore::compact() {
  // Keep the tables when most of them is still in use; rebuild them from the kept
  // batches when at least half is not.
  std::vector<char> used(stacks_.size(), 0);
  std::size_t in_use = 0;
  const auto use = [&](const Sample& s) {
    if (!used[s.stack]) {
      used[s.stack] = 1;
      ++in_use;
    }
  };
  for (const Batch& b : batches_) {
    for (const Sample& s : b.samples) use(s);
  }
  for (const Sample& s : carry_) use(s);
  if (in_use * 2 > stacks_.size()) return;
  std::vector<Frame> frames;
  std::map<Frame, std::uint32_t> frame_ids;
  std::vector<std::vector<std::uint32_t>> stacks;
  std::map<std::vector<std::uint32_t>, std::uint32_t> stack_ids;
  std::vector<std::uint32_t> new_stack(stacks_.size(), 0);
  for (std::size_t i = 0; i < stacks_.size(); ++i) {
    if (!used[i]) continue;
    std::vector<std::uint32_t> ids;
    for (std::uint32_t f : stacks_[i]) {
      auto [it, fresh] =
          frame_ids.try_emplace(frames_[f], static_cast<std::uint32_t>(frames.size()));
      if (fresh) frames.push_back(frames_[f]);
      ids.push_back(it->second);
    }
    auto [it, fresh] = stack_ids.try_emplace(ids, static_cast<std::uint32_t>(stacks.size()));
    if (fresh) stacks.push_back(std::move(ids));
    new_stack[i] = it->second;
  }
  for (Batch& b : batches_) {
    for (Sample& s : b.samples) s.stack = new_stack[s.stack];
  }
  for (Sample& s : carry_) s.stack = new_stack[s.stack];
  frames_ = std::move(frames);
  frame_ids_ = std::move(frame_ids);
  stacks_ = std::move(stacks);
  stack_ids_ = std::move(stack_ids);
}

ProfileWindow ProfileStore::window(Clock::time_point from, Clock::time_point to,
                                   const SampleFilter& filter) const {
  ProfileWindow w;
  w.frequency = frequency_;
  std::lock_guard lock(mutex_);
  std::unordered_map<std::uint32_t, std::uint32_t> stack_map, frame_map;
  bool first = true;
  for (const Batch& b : batches_) {
    if (b.end <= from || b.end > to) continue;
    if (first) {
      w.begin = b.begin;
      first = false;
    }
    w.end = b.end;
    for (const Sample& kept : b.samples) {
      if (!filter.matches(kept)) continue;
      Sample s = kept;
      auto [it, fresh] =
          stack_map.try_emplace(s.stack, static_cast<std::uint32_t>(w.stacks.size()));
      if (fresh) {
        std::vector<std::uint32_t> ids;
        for (std::uint32_t f : stacks_[s.stack]) {
          auto [fit, ffresh] =
              frame_map.try_emplace(f, static_cast<std::uint32_t>(w.frames.size()));
          if (ffresh) w.frames.push_back(frames_[f]);
          ids.push_back(fit->second);
        }
        w.stacks.push_back(std::move(ids));
      }
      s.stack = it->second;
      w.samples.push_back(std::move(s));
    }
  }
  if (first) w.begin = w.end = to;
  const auto wall = [now = Clock::now(),
                     wall_now = std::chrono::system_clock::now()](Clock::time_point t) {
    return wall_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(now - t);
  };
  w.wall_begin = wall(w.begin);
  w.wall_kept_from = wall(batches_.empty() ? to : batches_.front().begin);
  w.kept_for = limits_.retention;
  return w;
}

std::size_t ProfileStore::samples_kept() const {
  std::lock_guard lock(mutex_);
  return samples_;
}

std::size_t ProfileStore::frames_kept() const {
  std::lock_guard lock(mutex_);
  return frames_.size();
}

std::uint64_t ProfileStore::dropped_samples() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace ebpf_metricsd::profiling
