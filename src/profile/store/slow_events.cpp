#include "ebpf_metricsd/profile/slow_events.h"

#include "ebpf_metricsd/profile/profile_store.h"

#include <charconv>
#include <cstdio>

namespace ebpf_metricsd::profiling {

std::string stack_id_text(std::uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::optional<std::uint64_t> parse_stack_id(std::string_view text) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  std::uint64_t id = 0;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), id, 16);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size()) return std::nullopt;
  return id;
}

namespace {

// FNV-1a over the frames' names and modules: the same code path, the same id.
std::uint64_t hash_frames(const std::vector<Frame>& frames) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::string_view text) {
    for (const unsigned char c : text) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
    h ^= 0xff;  // a separator no name contains
    h *= 0x100000001b3ULL;
  };
  for (const Frame& f : frames) {
    mix(f.function);
    mix(f.module);
  }
  return h;
}

}  // namespace

std::uint64_t SlowEventStore::keep(SlowEvent e, std::vector<Frame> frames) {
  const std::uint64_t id = hash_frames(frames);
  std::lock_guard lock(mutex_);
  e.stack_id = id;
  auto [it, fresh] = stacks_.try_emplace(id);
  if (fresh) {
    frames_ += frames.size();
    it->second.frames = std::move(frames);
  }
  ++it->second.events;
  events_.push_back(std::move(e));
  expire(std::chrono::system_clock::now());
  return id;
}

void SlowEventStore::expire(std::chrono::system_clock::time_point now) {
  while (!events_.empty()) {
    const bool over = events_.size() > limits_.max_events || frames_ > limits_.max_frames;
    if (!over && events_.front().when >= now - limits_.retention) break;
    if (over) ++dropped_;
    auto it = stacks_.find(events_.front().stack_id);
    if (it != stacks_.end() && --it->second.events == 0) {
      frames_ -= it->second.frames.size();
      stacks_.erase(it);
    }
    events_.pop_front();
  }
}

SlowWindow SlowEventStore::query(const Query& q) const {
  SlowWindow w;
  w.end = q.until.value_or(std::chrono::system_clock::now());
  w.begin = q.since;
  std::lock_guard lock(mutex_);
  for (const SlowEvent& e : events_) {
    if (e.when < q.since || e.when > w.end || e.latency_ns < q.min_ns) continue;
    if (!q.metric.empty() && e.metric != q.metric) continue;
    if (q.stack_id && e.stack_id != *q.stack_id) continue;
    w.events.push_back(e);
    if (!w.stacks.count(e.stack_id)) {
      if (auto it = stacks_.find(e.stack_id); it != stacks_.end()) {
        w.stacks.emplace(e.stack_id, it->second.frames);
      }
    }
  }
  return w;
}

ProfileWindow slow_profile_window(const SlowWindow& w) {
  ProfileWindow out;
  const auto now_steady = Clock::now();
  const auto now_wall = std::chrono::system_clock::now();
  out.end = now_steady - std::chrono::duration_cast<Clock::duration>(now_wall - w.end);
  out.begin = now_steady - std::chrono::duration_cast<Clock::duration>(now_wall - w.begin);
  out.wall_begin = w.begin;
  std::map<Frame, std::uint32_t> frame_ids;
  std::map<std::uint64_t, std::uint32_t> stack_ids;
  for (const auto& [id, frames] : w.stacks) {
    std::vector<std::uint32_t> stack;
    for (const Frame& f : frames) {
      auto [it, fresh] = frame_ids.try_emplace(f, static_cast<std::uint32_t>(out.frames.size()));
      if (fresh) out.frames.push_back(f);
      stack.push_back(it->second);
    }
    stack_ids[id] = static_cast<std::uint32_t>(out.stacks.size());
    out.stacks.push_back(std::move(stack));
  }
  for (const SlowEvent& e : w.events) {
    auto it = stack_ids.find(e.stack_id);
    if (it == stack_ids.end()) continue;
    Sample s;
    s.pid = e.pid;
    s.tid = e.tid;
    s.comm = e.comm;
    s.workload = e.workload;
    s.kind = SampleKind::OffCpu;
    s.count = 1;
    s.ns = e.latency_ns;
    s.stack = it->second;
    out.samples.push_back(std::move(s));
  }
  return out;
}

void SlowEventStore::set_limits(Limits limits) {
  std::lock_guard lock(mutex_);
  limits_ = limits;
  expire(std::chrono::system_clock::now());
}

void SlowEventStore::expire_old() {
  std::lock_guard lock(mutex_);
  expire(std::chrono::system_clock::now());
}

std::size_t SlowEventStore::events_kept() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::size_t SlowEventStore::stacks_kept() const {
  std::lock_guard lock(mutex_);
  return stacks_.size();
}

std::size_t SlowEventStore::frames_kept() const {
  std::lock_guard lock(mutex_);
  return frames_;
}

std::uint64_t SlowEventStore::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace ebpf_metricsd::profiling
