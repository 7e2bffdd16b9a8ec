#include "ebpf_metricsd/drain.h"

#include <spdlog/spdlog.h>
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

DrainLoop::DrainLoop(MetricStore& store, std::chrono::milliseconds interval)
    : store_(store),
      duration_metric_(store.declare({"ebpf_metricsd_drain_duration_seconds",
                                      "How long the last drain of a tracer's maps took.",
                                      MetricType::Gauge,
                                      {"tracer"}})),
      errors_metric_(store.declare({"ebpf_metricsd_drain_errors_total",
                                    "Drains of a tracer's maps that failed.",
                                    MetricType::Counter,
                                    {"tracer"}})),
      interval_(interval) {}

DrainLoop::~DrainLoop() { stop(); }

void DrainLoop::add(std::string name, Tracer* tracer) {
  std::lock_guard lock(tracers_mutex_);
  store_.add(errors_metric_, {name}, 0);
  tracers_.push_back({std::move(name), tracer});
}

void DrainLoop::remove(const std::string& name) {
  std::lock_guard lock(tracers_mutex_);
  bool ok = true;
  for (auto& e : tracers_) {
    if (e.name == name) drain_entry(e, ok);
  }
  std::erase_if(tracers_, [&](const Entry& e) { return e.name == name; });
}

void DrainLoop::set_interval(std::chrono::milliseconds interval) {
  {
    std::lock_guard lock(mutex_);
    interval_ = interval;
  }
  wake_.notify_all();
}

void DrainLoop::drain_entry(Entry& e, bool& all_ok) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    e.tracer->drain();
  } catch (const std::exception& ex) {
    all_ok = false;
    store_.add(errors_metric_, {e.name}, 1);
    spdlog::error("drain of tracer {} failed: {}", e.name, ex.what());
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  store_.set(duration_metric_, {e.name}, took.count());
}

bool DrainLoop::drain_once() {
  std::lock_guard lock(tracers_mutex_);
  bool all_ok = true;
  for (auto& e : tracers_) drain_entry(e, all_ok);
  return all_ok;
}

void DrainLoop::start() {
  // The first rounds get the same grace as any later ones.
  last_success_ns_ = steady_now_ns();
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      if (drain_once()) {
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
