#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ebpf_metricsd/metric_store.h"
#include "ebpf_metricsd/tracer.h"

namespace ebpf_metricsd {

// Every interval, drains each running tracer into the store and records how long it took.
// Pings the systemd watchdog after a round in which every drain succeeded, so a wedged
// collector gets restarted.
class DrainLoop {
 public:
  DrainLoop(MetricStore& store, std::chrono::milliseconds interval);
  ~DrainLoop();

  // add/remove wait for a drain in progress; `remove` first drains the tracer one last
  // time, so nothing it counted is lost when it is then destroyed.
  void add(std::string name, Tracer* tracer);
  void remove(const std::string& name);
  void set_interval(std::chrono::milliseconds interval);
  // One round over all tracers; true when every drain succeeded.
  bool drain_once();
  void start();
  void stop();
  // Whether a round in which every drain succeeded ended within the last three intervals
  // (at least 30 s): what the systemd watchdog sees, for health checks elsewhere.
  bool healthy() const;

 private:
  struct Entry {
    std::string name;
    Tracer* tracer;
  };
  MetricStore& store_;
  MetricStore::MetricId duration_metric_;
  MetricStore::MetricId errors_metric_;
  std::chrono::milliseconds interval_;
  void drain_entry(Entry& e, bool& all_ok);
  std::mutex tracers_mutex_;  // held while draining
  std::vector<Entry> tracers_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<std::int64_t> last_success_ns_{0};  // steady clock
  std::thread thread_;
};

}  // namespace ebpf_metricsd
