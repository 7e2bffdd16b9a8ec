#pragma once

#include <chrono>
#include <condition_variable>
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

  void add(std::string name, Tracer* tracer);
  // One round over all tracers; true when every drain succeeded.
  bool drain_once();
  void start();
  void stop();

 private:
  struct Entry {
    std::string name;
    Tracer* tracer;
  };
  MetricStore& store_;
  MetricStore::MetricId duration_metric_;
  MetricStore::MetricId errors_metric_;
  std::chrono::milliseconds interval_;
  std::vector<Entry> tracers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ebpf_metricsd
