#pragma once
// The moment by which each open connection must have made progress, and the thread that ends
// those past it. Internal to the web server.

#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "ebpf_metricsd/http/tls.h"

namespace ebpf_metricsd::http_internal {

using Clock = std::chrono::steady_clock;

// One open connection: its socket, the TLS credentials it started with, and the moment by
// which it must have made progress (none while a handler works on its request).
struct Connection {
  int fd = -1;
  std::shared_ptr<const TlsCredentials> tls;
  bool armed = false;
  Clock::time_point deadline;
  bool cut = false;
};

// Ends connections that are past their deadline by shutting their socket down: the event
// loop then sees the end of the stream and closes the connection itself. A connection is
// unregistered (under the same lock) before libmicrohttpd closes its descriptor, so a
// descriptor is never shut down after it has been reused.
class DeadlineWatch {
 public:
  explicit DeadlineWatch(std::chrono::milliseconds timeout)
      : timeout_(timeout), thread_([this] { run(); }) {}
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

  void add(Connection* c) {
    std::lock_guard lock(mutex_);
    connections_.insert(c);
    arm_locked(c);
  }
  void remove(Connection* c) {
    std::lock_guard lock(mutex_);
    connections_.erase(c);
  }
  void arm(Connection* c) {
    std::lock_guard lock(mutex_);
    arm_locked(c);
  }
  void disarm(Connection* c) {
    std::lock_guard lock(mutex_);
    c->armed = false;
  }

 private:
  void arm_locked(Connection* c) {
    c->armed = true;
    c->deadline = Clock::now() + timeout_;
    if (c->deadline < next_wake_) wake_.notify_one();
  }
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      const auto now = Clock::now();
      next_wake_ = now + std::chrono::seconds(1);
      for (Connection* c : connections_) {
        if (!c->armed || c->cut) continue;
        if (c->deadline <= now) {
          shutdown(c->fd, SHUT_RDWR);
          c->cut = true;
        } else {
          next_wake_ = std::min(next_wake_, c->deadline);
        }
      }
      wake_.wait_until(lock, next_wake_);
    }
  }

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::set<Connection*> connections_;
  Clock::time_point next_wake_ = Clock::time_point::max();
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace ebpf_metricsd::http_internal
