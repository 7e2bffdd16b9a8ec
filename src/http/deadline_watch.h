#pragma once
// The moment by which each open connection must have made progress, and the thread that ends
// those past it. Internal to the web server.

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

namespace ebpf_metricsd::http_internal {

using Clock = std::chrono::steady_clock;

// A connection's socket as the watch sees it; fields are guarded by the watch.
struct WatchedSocket {
  int fd = -1;
  bool armed = false;
  Clock::time_point deadline;
  bool cut = false;
};

// Ends sockets that are past their deadline by shutting them down: the event loop then sees
// the end of the stream and closes the connection itself. The owner removes a socket (under
// the same lock) before its descriptor is closed, so a descriptor is never shut down after it
// has been reused.
class DeadlineWatch {
 public:
  DeadlineWatch() : thread_([this] { run(); }) {}
  ~DeadlineWatch() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  DeadlineWatch(const DeadlineWatch&) = delete;
  DeadlineWatch& operator=(const DeadlineWatch&) = delete;

  void add(WatchedSocket* s, std::chrono::milliseconds within) {
    std::lock_guard lock(mutex_);
    sockets_.insert(s);
    arm_locked(s, within);
  }
  void remove(WatchedSocket* s) {
    std::lock_guard lock(mutex_);
    sockets_.erase(s);
  }
  // From now, `s` has `within` to make progress.
  void arm(WatchedSocket* s, std::chrono::milliseconds within) {
    std::lock_guard lock(mutex_);
    arm_locked(s, within);
  }
  // `s` has no deadline until armed again (the server is at work on its request).
  void disarm(WatchedSocket* s) {
    std::lock_guard lock(mutex_);
    s->armed = false;
  }

 private:
  // Deadlines are checked at most this often: one pass for many connections that arrive
  // together, at the price of cutting them up to this much late.
  static constexpr std::chrono::milliseconds kResolution{50};

  void arm_locked(WatchedSocket* s, std::chrono::milliseconds within) {
    s->armed = true;
    s->deadline = Clock::now() + within;
    if (s->deadline < next_wake_) wake_.notify_one();
  }
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      const auto now = Clock::now();
      next_wake_ = now + std::chrono::seconds(1);
      for (WatchedSocket* s : sockets_) {
        if (!s->armed || s->cut) continue;
        if (s->deadline <= now) {
          shutdown(s->fd, SHUT_RDWR);
          s->cut = true;
        } else {
          next_wake_ = std::min(next_wake_, s->deadline);
        }
      }
      next_wake_ = std::max(next_wake_, now + kResolution);
      wake_.wait_until(lock, next_wake_);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::set<WatchedSocket*> sockets_;
  Clock::time_point next_wake_ = Clock::time_point::max();
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace ebpf_metricsd::http_internal
