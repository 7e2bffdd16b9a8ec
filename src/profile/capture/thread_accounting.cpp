#include "thread_accounting.h"

#include <bpf/bpf.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "ebpf_metricsd/bpf/map_reader.h"

namespace ebpf_metricsd::profiling {

namespace {
Frame marker(const char* why) {
  Frame f;
  f.function = why;
  f.module = "[unknown]";
  return f;
}
}  // namespace

std::span<const Frame> no_stack() {
  static const Frame none = marker("[no stack]");
  return {&none, 1};
}

std::span<const Frame> stack_not_kept() {
  static const Frame gone = marker("[stack not kept]");
  return {&gone, 1};
}

bool ThreadAccounting::start(bpf_program* iterator, const bpf_map* thread_ends) {
  thread_ends_ = thread_ends;
  seen_at_ = ns_of(Clock::now());
  if (iterator) link_.reset(bpf_program__attach_iter(iterator, nullptr));
  if (!link_) {
    spdlog::warn(
        "profile: no task iterator ({}): threads' time comes from samples, and waits count "
        "once they end",
        iterator ? std::strerror(errno) : "the kernel's own BTF is not available");
    return false;
  }
  const std::vector<profile_thread> threads = now();
  for (std::size_t i = 0; i < exited_from_; ++i)
    seen_[threads[i].tid] = {threads[i].start, threads[i].on_cpu, threads[i].run_delay};
  if (!threads.empty()) seen_at_ = threads.front().now;
  return true;
}

std::vector<profile_thread> ThreadAccounting::now() {
  std::vector<profile_thread> out;
  if (!link_) return out;
  const int fd = bpf_iter_create(bpf_link__fd(link_.get()));
  if (fd < 0) {
    spdlog::warn("profile: read the threads: {}", std::strerror(errno));
    return out;
  }
  std::vector<std::byte> bytes;
  std::array<std::byte, 64 * 1024> buf;
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) spdlog::warn("profile: read the threads: {}", std::strerror(errno));
    if (n <= 0) break;
    bytes.insert(bytes.end(), buf.begin(), buf.begin() + n);
  }
  close(fd);
  out.resize(bytes.size() / sizeof(profile_thread));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(profile_thread));
  const std::size_t alive = out.size();
  read_map_fd(bpf_map__fd(thread_ends_), false)
      ->take_each<__u32, profile_thread>(bpf_map__max_entries(thread_ends_),
                                         [&](__u32, profile_thread t) {
                                           t.blocked = 0;  // exited: its waits are over
                                           out.push_back(t);
                                         });
  exited_from_ = alive;
  return out;
}

std::vector<ThreadTime> ThreadAccounting::account(const std::vector<profile_thread>& now,
                                                  std::vector<Sample>& waiting,
                                                  std::vector<StackView>& stacks,
                                                  std::deque<std::vector<Frame>>& owned) {
  std::vector<ThreadTime> out;
  const __u64 since = seen_at_;
  std::unordered_map<__u32, Seen> seen;
  seen.reserve(exited_from_);
  for (std::size_t i = 0; i < now.size(); ++i) {
    const profile_thread& t = now[i];
    const bool exited = i >= exited_from_;
    // Its values when last seen: by this pass (a thread that exited since), or the last;
    // none for a thread that began since (all its time counts); else from now on.
    Seen before{};
    const auto last = [&](const std::unordered_map<__u32, Seen>& m) {
      const auto it = m.find(t.tid);
      if (it == m.end() || it->second.start != t.start) return false;
      before = it->second;
      return true;
    };
    if (!last(seen) && !last(seen_) && t.start < since) before = {t.start, t.on_cpu, t.run_delay};
    if (!exited) {
      seen[t.tid] = {t.start, t.on_cpu, t.run_delay};
    } else if (auto it = seen.find(t.tid); it != seen.end() && it->second.start == t.start) {
      seen.erase(it);  // not another thread that has its id since
    }
    const __u64 on = t.on_cpu > before.on_cpu ? t.on_cpu - before.on_cpu : 0;
    const __u64 delay = t.run_delay > before.run_delay ? t.run_delay - before.run_delay : 0;
    if (on || delay) {
      ThreadTime x;
      x.pid = t.tgid;
      x.tid = t.tid;
      x.comm = fixed_name(t.comm);
      if (names_) x.workload = names_->label(t.cgroup);
      x.on_cpu_ns = on;
      x.run_delay_ns = delay;
      out.push_back(std::move(x));
    }
    if (exited || t.blocked == 0 || t.now <= t.blocked) continue;
    Sample w;
    w.pid = t.tgid;
    w.tid = t.tid;
    w.comm = fixed_name(t.comm);
    if (names_) w.workload = names_->label(t.cgroup);
    w.kind = SampleKind::OffCpu;
    w.syscall = t.syscall;
    w.count = 0;  // counted when it ends
    w.ns = t.now - t.blocked;
    w.began = monotonic(t.blocked);
    w.ended = monotonic(t.now);
    w.stack = static_cast<std::uint32_t>(stacks.size());
    stacks.push_back(waiting_stack(t, owned));
    waiting.push_back(std::move(w));
  }
  seen_ = std::move(seen);
  if (!now.empty()) seen_at_ = now.front().now;
  return out;
}

// The stack of a wait in progress: where it sleeps in the kernel, and its user stack as far
// as known now. Inside a system call with `unwind: cfi` that is taken when the call returns:
// until then, the function the call returns to, under a frame that says so.
StackView ThreadAccounting::waiting_stack(const profile_thread& t,
                                          std::deque<std::vector<Frame>>& owned) {
  StackView view;
  if (const std::vector<Frame>* k = stacks_.kernel_frames(t.kstack, true)) view.parts[0] = *k;
  if (t.ustack != 0) {
    if (const std::vector<Frame>* u = stacks_.user_frames(t.tgid, t.ustack)) view.parts[1] = *u;
  } else if (t.ip != 0 && !t.kernel) {
    const std::vector<std::uint64_t> ip = {t.ip};
    std::vector<Frame>& leaf = owned.emplace_back(symbolizer_.user_frames(t.tgid, ip, lines_));
    Frame callers;
    callers.function = "[waiting: callers known when the call returns]";
    callers.module = "[unknown]";
    leaf.push_back(std::move(callers));
    view.parts[1] = leaf;
  }
  if (view.parts[0].empty() && view.parts[1].empty()) view.parts[0] = no_stack();
  return view;
}

}  // namespace ebpf_metricsd::profiling
