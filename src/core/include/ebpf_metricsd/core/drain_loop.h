#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ebpf_metricsd {

// Every interval runs a round (draining every running tracer: TracerSet::drain). Pings the
// systemd watchdog after a round that succeeded, so a wedged collector gets restarted.
class DrainLoop {
 public:
  // `round` returns whether every drain of the round succeeded.
  DrainLoop(std::function<bool()> round, std::chrono::milliseconds interval);
  ~DrainLoop();

  void set_interval(std::chrono::milliseconds interval);
  void start();
  void stop();
  // Whether a round in which every drain succeeded ended within the last three intervals
  // (at least 30 s): what the systemd watchdog sees, for health checks elsewhere.
  bool healthy() const;

 private:
  std::function<bool()> round_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<std::int64_t> last_success_ns_{0};  // steady clock
  std::thread thread_;
};

}  // namespace ebpf_metricsd
