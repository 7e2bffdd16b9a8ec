#include "ebpf_metricsd/core/drain_loop.h"

#include <systemd/sd-daemon.h>

#include <algorithm>

namespace ebpf_metricsd {

namespace {
std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

DrainLoop::DrainLoop(std::function<bool()> round, std::chrono::milliseconds interval)
    : round_(std::move(round)), interval_(interval) {}

DrainLoop::~DrainLoop() { stop(); }

void DrainLoop::set_interval(std::chrono::milliseconds interval) {
  {
    std::lock_guard lock(mutex_);
    interval_ = interval;
  }
  wake_.notify_all();
}

void DrainLoop::start() {
  // The first rounds get the same grace as any later ones.
  last_success_ns_ = steady_now_ns();
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      if (round_()) {
        last_success_ns_ = steady_now_ns();
        sd_notify(0, "WATCHDOG=1");
      }
      lock.lock();
      // Under a systemd watchdog, rounds come at least three times per watchdog period.
      auto wait = interval_;
      std::uint64_t watchdog_usec = 0;
      if (sd_watchdog_enabled(0, &watchdog_usec) > 0) {
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::microseconds(watchdog_usec / 3)));
      }
      const auto deadline = std::chrono::steady_clock::now() + wait;
      wake_.wait_until(lock, deadline, [this] { return stopping_; });
    }
  });
}

bool DrainLoop::healthy() const {
  const std::int64_t last = last_success_ns_;
  if (last == 0) return false;
  std::chrono::milliseconds interval;
  {
    std::lock_guard lock(mutex_);
    interval = interval_;
  }
  const auto allowed = std::max<std::chrono::nanoseconds>(3 * interval, std::chrono::seconds(30));
  return std::chrono::nanoseconds(steady_now_ns() - last) <= allowed;
}

void DrainLoop::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ebpf_metricsd
