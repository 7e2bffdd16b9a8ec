#include "ebpf_metricsd/profile/profile_store.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace ebpf_metricsd::profiling {

namespace {

void mix(std::size_t& h, std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); }

// The part of wait s (from s.began to s.ended) within [from, to), in proportion to the span.
template <class S>
std::uint64_t part_within(const S& s, Clock::time_point from, Clock::time_point to) {
  const Clock::time_point ended = std::max(s.ended, s.began);
  from = std::max(from, s.began);
  to = std::min(to, ended);
  if (to <= from) return 0;
  // ns x ns can pass 2^64: the product in 128 bits.
  __extension__ using Wide = unsigned __int128;
  const auto span = static_cast<Wide>((ended - s.began).count());
  return static_cast<std::uint64_t>(s.ns * static_cast<Wide>((to - from).count()) / span);
}

}  // namespace

std::size_t ProfileStore::FrameIdHash::operator()(const KeptFrame& f) const {
  std::size_t h = std::hash<std::uint64_t>{}(f.address);
  mix(h, f.function);
  mix(h, f.module);
  mix(h, f.build_id);
  mix(h, f.kernel);
  for (const SourceLine& l : f.lines) mix(h, std::hash<std::string>{}(l.function) ^ l.line);
  return h;
}

std::uint32_t ProfileStore::intern_name(const std::string& text) {
  const auto [it, fresh] = name_ids_.try_emplace(text, static_cast<std::uint32_t>(names_.size()));
  if (fresh) {
    names_.push_back(&it->first);
    names_heap_ += string_heap_bytes(it->first);
  }
  return it->second;
}

ProfileStore::KeptFrame ProfileStore::keep_frame(const Frame& f) {
  return {
      f.address, intern_name(f.function), intern_name(f.module), intern_name(f.build_id), f.kernel,
      f.lines};
}

Frame ProfileStore::unpack_frame(const KeptFrame& f) const {
  Frame out;
  out.function = *names_[f.function];
  out.module = *names_[f.module];
  out.build_id = *names_[f.build_id];
  out.address = f.address;
  out.kernel = f.kernel;
  out.lines = f.lines;
  return out;
}

std::size_t ProfileStore::StackIdHash::operator()(std::uint32_t id) const {
  std::size_t h = 0;
  for (std::uint32_t f : (*stacks)[id]) mix(h, f);
  return h;
}

std::uint32_t ProfileStore::intern(const StackView& stack) {
  std::vector<std::uint32_t> ids;
  std::size_t n = 0;
  for (const auto& part : stack.parts) n += part.size();
  ids.reserve(n);
  for (const auto& part : stack.parts) {
    for (const Frame& f : part) {
      KeptFrame kept = keep_frame(f);
      if (const auto known = frame_ids_.find(kept); known != frame_ids_.end()) {
        ids.push_back(*known);
        continue;
      }
      frames_.push_back(std::move(kept));
      frames_heap_ += lines_heap_bytes(frames_.back().lines);
      ids.push_back(*frame_ids_.insert(static_cast<std::uint32_t>(frames_.size() - 1)).first);
    }
  }
  return intern_ids(std::move(ids));
}

std::uint32_t ProfileStore::intern_ids(std::vector<std::uint32_t> ids) {
  // A candidate at the end of the table: kept when new, taken back when known.
  stacks_.push_back(std::move(ids));
  const auto [it, fresh] = stack_ids_.insert(static_cast<std::uint32_t>(stacks_.size() - 1));
  if (fresh)
    stacks_heap_ += stacks_.back().capacity() * sizeof(std::uint32_t);
  else
    stacks_.pop_back();
  return *it;
}

std::uint32_t ProfileStore::intern_who(const std::string& comm, const CgroupLabel& workload) {
  std::string key = comm;
  for (const std::string* part : {&workload.cgroup, &workload.pod, &workload.container}) {
    key += '\0';
    key += *part;
  }
  const auto [it, fresh] = who_ids_.try_emplace(std::move(key), whos_.size());
  if (fresh) whos_.push_back({comm, workload});
  return it->second;
}

ProfileStore::Kept ProfileStore::keep(const Sample& s, std::uint32_t stack) {
  return {s.pid,   s.tid,  intern_who(s.comm, s.workload), stack, s.syscall, s.kind, s.count, s.ns,
          s.began, s.ended};
}

Sample ProfileStore::unpack(const Kept& k) const {
  Sample s;
  s.pid = k.pid;
  s.tid = k.tid;
  s.comm = whos_[k.who].comm;
  s.workload = whos_[k.who].workload;
  s.kind = k.kind;
  s.syscall = k.syscall;
  s.count = k.count;
  s.ns = k.ns;
  s.stack = k.stack;
  return s;
}

void ProfileStore::add_batch(Clock::time_point end, std::vector<Sample> samples,
                             const std::vector<std::vector<Frame>>& stacks,
                             std::optional<std::vector<ThreadTime>> threads,
                             std::vector<Sample> waiting) {
  std::vector<StackView> views(stacks.size());
  for (std::size_t i = 0; i < stacks.size(); ++i) views[i].parts[0] = stacks[i];
  add_viewed_batch(end, std::move(samples), views, std::move(threads), std::move(waiting));
}

void ProfileStore::add_viewed_batch(Clock::time_point end, std::vector<Sample> samples,
                                    const std::vector<StackView>& stacks,
                                    std::optional<std::vector<ThreadTime>> threads,
                                    std::vector<Sample> waiting) {
  for (const std::vector<Sample>* list : {&samples, &waiting}) {
    for (const Sample& s : *list) {
      if (s.stack >= stacks.size()) throw std::out_of_range("profile sample without its stack");
    }
  }
  std::lock_guard lock(mutex_);
  // Samples first, then the threads' accounting, within max_samples.
  std::size_t room = limits_.max_samples;
  if (samples.size() > room) {
    dropped_ += samples.size() - room;
    samples.resize(room);
  }
  room -= samples.size();
  bool accounted = threads.has_value();
  if (threads && threads->size() > room) {
    dropped_ += threads->size() - room;
    threads->resize(room);
    accounted = false;  // some threads' time is not in it
  }
  std::vector<std::uint32_t> ids(stacks.size(), 0);
  std::vector<char> interned(stacks.size(), 0);
  const auto stack_id = [&](std::uint32_t i) {
    if (!interned[i]) {
      ids[i] = intern(stacks[i]);
      interned[i] = 1;
    }
    return ids[i];
  };
  Batch batch{last_end_, end, {}, {}, accounted};
  batch.samples.reserve(samples.size());  // kept for minutes: no room to grow
  for (const Sample& s : samples) batch.samples.push_back(keep(s, stack_id(s.stack)));
  if (threads) {
    batch.threads.reserve(threads->size());
    for (const ThreadTime& t : *threads) {
      batch.threads.push_back(
          {t.pid, t.tid, intern_who(t.comm, t.workload), t.on_cpu_ns, t.run_delay_ns});
    }
  }
  waiting_.clear();
  for (const Sample& s : waiting) waiting_.push_back(keep(s, stack_id(s.stack)));
  // Every read is a batch, an empty one too: windows of it get their part of the waits
  // that span it.
  samples_ += batch.samples.size() + batch.threads.size();
  batches_.push_back(std::move(batch));
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

void ProfileStore::expire(Clock::time_point now) {
  // The newest batch stays; older ones go after the retention, or, oldest first, while
  // all together hold more than max_samples.
  bool removed = false;
  while (batches_.size() > 1 &&
         (batches_.front().end + limits_.retention < now || samples_ > limits_.max_samples)) {
    samples_ -= batches_.front().samples.size() + batches_.front().threads.size();
    batches_.pop_front();
    removed = true;
  }
  if (removed) compact();
}

void ProfileStore::compact() {
  // Keep the tables when most of them is still in use; rebuild them from the kept
  // batches when at least half is not.
  std::vector<char> used(stacks_.size(), 0), used_who(whos_.size(), 0);
  std::size_t in_use = 0, whos_in_use = 0;
  const auto use_who = [&](std::uint32_t who) {
    if (!used_who[who]) {
      used_who[who] = 1;
      ++whos_in_use;
    }
  };
  const auto use = [&](const Kept& k) {
    if (!used[k.stack]) {
      used[k.stack] = 1;
      ++in_use;
    }
    use_who(k.who);
  };
  for (const Batch& b : batches_) {
    for (const Kept& k : b.samples) use(k);
    for (const KeptTime& t : b.threads) use_who(t.who);
  }
  for (const Kept& k : waiting_) use(k);
  if (whos_in_use * 2 <= whos_.size()) {
    std::vector<Who> whos = std::move(whos_);
    whos_.clear();
    who_ids_.clear();
    std::vector<std::uint32_t> new_who(whos.size(), 0);
    for (std::size_t i = 0; i < whos.size(); ++i) {
      if (used_who[i]) new_who[i] = intern_who(whos[i].comm, whos[i].workload);
    }
    for (Batch& b : batches_) {
      for (Kept& k : b.samples) k.who = new_who[k.who];
      for (KeptTime& t : b.threads) t.who = new_who[t.who];
    }
    for (Kept& k : waiting_) k.who = new_who[k.who];
  }
  if (in_use * 2 > stacks_.size()) return;
  std::vector<KeptFrame> frames = std::move(frames_);
  std::vector<std::vector<std::uint32_t>> stacks = std::move(stacks_);
  // The names, kept again as the frames kept use them.
  std::unordered_map<std::string, std::uint32_t> name_ids = std::move(name_ids_);
  std::vector<const std::string*> names = std::move(names_);
  frames_.clear();
  stacks_.clear();
  frame_ids_.clear();
  stack_ids_.clear();
  name_ids_.clear();
  names_.clear();
  frames_heap_ = 0;
  stacks_heap_ = 0;
  names_heap_ = 0;
  // The frames the used stacks have, moved over (each was kept once), under new ids.
  constexpr std::uint32_t kGone = ~std::uint32_t{0};
  std::vector<std::uint32_t> new_stack(stacks.size(), 0), new_frame(frames.size(), kGone);
  for (std::size_t i = 0; i < stacks.size(); ++i) {
    if (!used[i]) continue;
    std::vector<std::uint32_t> ids;
    ids.reserve(stacks[i].size());
    for (std::uint32_t f : stacks[i]) {
      if (new_frame[f] == kGone) {
        new_frame[f] = static_cast<std::uint32_t>(frames_.size());
        KeptFrame& moved = frames_.emplace_back(std::move(frames[f]));
        for (std::uint32_t* name : {&moved.function, &moved.module, &moved.build_id})
          *name = intern_name(*names[*name]);
        frames_heap_ += lines_heap_bytes(moved.lines);
        frame_ids_.insert(new_frame[f]);
      }
      ids.push_back(new_frame[f]);
    }
    new_stack[i] = intern_ids(std::move(ids));
  }
  for (Batch& b : batches_) {
    for (Kept& k : b.samples) k.stack = new_stack[k.stack];
  }
  for (Kept& k : waiting_) k.stack = new_stack[k.stack];
}

ProfileWindow ProfileStore::window(Clock::time_point from, Clock::time_point to,
                                   const SampleFilter& filter) const {
  ProfileWindow w;
  w.frequency = frequency_;
  std::lock_guard lock(mutex_);
  bool first = true;
  for (const Batch& b : batches_) {
    if (b.end <= from || b.end > to) continue;
    if (first) w.begin = b.begin;
    first = false;
    w.end = b.end;
  }
  std::unordered_map<std::uint32_t, std::uint32_t> stack_map, frame_map;
  const auto add = [&](Sample s) {
    auto [it, fresh] = stack_map.try_emplace(s.stack, static_cast<std::uint32_t>(w.stacks.size()));
    if (fresh) {
      std::vector<std::uint32_t> ids;
      for (std::uint32_t f : stacks_[s.stack]) {
        auto [fit, ffresh] = frame_map.try_emplace(f, static_cast<std::uint32_t>(w.frames.size()));
        if (ffresh) w.frames.push_back(unpack_frame(frames_[f]));
        ids.push_back(fit->second);
      }
      w.stacks.push_back(std::move(ids));
    }
    s.stack = it->second;
    s.began = s.ended = {};
    w.samples.push_back(std::move(s));
  };
  const auto wanted = [&](std::uint32_t pid, std::uint32_t tid, std::uint32_t who_id) {
    const Who& who = whos_[who_id];
    const struct {
      std::uint32_t pid, tid;
      const std::string& comm;
      const CgroupLabel& workload;
    } named{pid, tid, who.comm, who.workload};
    return filter.matches(named);
  };
  // A kept sample or wait into the window: `inside`, it is of a batch of the window.
  const auto take = [&](const Kept& kept, bool inside) {
    const bool spans = kept.began != Clock::time_point{};
    if (!spans && !inside) return;
    const std::uint64_t part = spans ? part_within(kept, w.begin, w.end) : kept.ns;
    if (!inside && part == 0) return;
    if (!wanted(kept.pid, kept.tid, kept.who)) return;
    Sample s = unpack(kept);
    s.ns = part;
    if (!inside) s.count = 0;  // counted in the window where it ended
    add(std::move(s));
  };
  std::map<std::uint32_t, ThreadTime> threads;
  w.accounted = !first;
  for (const Batch& b : batches_) {
    if (first) break;
    // A wait is kept in the batch it came with, from the batch where it ended (or the one
    // read while it ended): any batch's may overlap the window.
    const bool inside = b.end > w.begin && b.end <= w.end;
    for (const Kept& kept : b.samples) take(kept, inside);
    if (!inside) continue;
    w.accounted = w.accounted && b.accounted;
    for (const KeptTime& t : b.threads) {
      if (!wanted(t.pid, t.tid, t.who)) continue;
      ThreadTime& sum = threads[t.tid];
      if (sum.pid != t.pid || sum.comm.empty()) {
        sum.pid = t.pid;
        sum.tid = t.tid;
        sum.comm = whos_[t.who].comm;
        sum.workload = whos_[t.who].workload;
      }
      sum.on_cpu_ns += t.on_cpu_ns;
      sum.run_delay_ns += t.run_delay_ns;
    }
  }
  // The waits still in progress at the newest batch's end: their part up to then. None ended,
  // so none is counted.
  if (!first) {
    for (const Kept& kept : waiting_) take(kept, false);
  }
  for (auto& [tid, t] : threads) w.threads.push_back(std::move(t));
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

ProfileStore::Bytes ProfileStore::bytes() const {
  // A hash set's node and its bucket: a pointer each, beside the id.
  constexpr std::size_t kSetEntry = 3 * sizeof(void*);
  std::lock_guard lock(mutex_);
  Bytes b;
  for (const Batch& batch : batches_) {
    b.samples += sizeof(Batch) + batch.samples.capacity() * sizeof(Kept) +
                 batch.threads.capacity() * sizeof(KeptTime);
  }
  b.samples += waiting_.capacity() * sizeof(Kept) + whos_.capacity() * sizeof(Who);
  for (const Who& w : whos_) b.samples += w.comm.size() + w.workload.cgroup.size();
  // The tables' own arrays, and what their entries hold on the heap, kept as they change (a
  // walk of every frame and stack would hold the lock for long on every read).
  b.stacks = stacks_.capacity() * sizeof(std::vector<std::uint32_t>) + stacks_heap_ +
             stack_ids_.size() * kSetEntry;
  // A name: its node in name_ids_ (a pointer, the string, the id and the cached hash) and
  // its bucket; its pointer in names_ and its text are counted apart.
  constexpr std::size_t kNameEntry =
      2 * sizeof(void*) + sizeof(std::string) + sizeof(std::uint64_t) + sizeof(void*);
  b.frames = frames_.capacity() * sizeof(KeptFrame) + frames_heap_ + frame_ids_.size() * kSetEntry +
             names_.capacity() * sizeof(void*) + name_ids_.size() * kNameEntry + names_heap_;
  return b;
}

std::uint64_t ProfileStore::dropped_samples() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace ebpf_metricsd::profiling
