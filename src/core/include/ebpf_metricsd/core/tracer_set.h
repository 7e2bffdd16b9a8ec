#pragma once
// The running tracers: each in one slot that holds its config, the tracer, its metric scope
// and its state. Starting, stopping, restarting with counters carried over, and draining
// happen here and nowhere else.

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/core/tracer.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/metrics/metric_store.h"

namespace ebpf_metricsd {

// A tracer as the landing page and tracer_up show it.
struct TracerStatus {
  std::string name;
  std::string summary;
  bool enabled = false;
  bool up = false;
  std::string hook;   // the attach type in use, "none" when not up
  std::string error;  // why it is not up
};

class TracerSet {
 public:
  // Builds a tracer from its config section and starts it (the daemon's is the registry's
  // build_tracer; a test gives its own); throws when it cannot start.
  using Builder = std::function<std::unique_ptr<Tracer>(const TracerConfig&, MetricScope&)>;

  TracerSet(MetricStore& store, Builder builder);
  ~TracerSet();
  TracerSet(const TracerSet&) = delete;
  TracerSet& operator=(const TracerSet&) = delete;

  // Brings the tracers in line with `configs`: starts the newly enabled, stops the newly
  // disabled (their series go), restarts those whose section changed or that were not up
  // (their counters carry on), and leaves the rest running. Returns the names of tracers
  // that are enabled but failed to start.
  std::vector<std::string> apply(const std::vector<TracerConfig>& configs);
  // Drains every running tracer into the store; false when a drain failed (counted in
  // ebpf_metricsd_drain_errors_total).
  bool drain();
  // From now on a drain in progress skips the tracers it has not reached, the tracer it is
  // in abandons its work (Tracer::abandon), and stop_all() drains none: at the daemon's exit
  // nothing drained would be served, and a profile's drain (unwinding and symbolizing what
  // it holds) can take seconds on a busy host. Called from the thread that applies configs.
  void begin_exit();
  // Stops every tracer; each is drained a last time unless begin_exit() came first.
  void stop_all();

  std::vector<TracerStatus> statuses() const;
  std::size_t running() const;
  std::size_t enabled() const;

 private:
  struct Slot {
    TracerConfig config;
    std::unique_ptr<MetricScope> scope;
    std::unique_ptr<Tracer> tracer;  // null when not running
  };
  void start(Slot& slot);
  // Drains it a last time and unloads it; its series stay owned by it.
  void detach(Slot& slot);
  // keep_series: a restart follows, which declares the metrics again and adds to them.
  void stop(Slot& slot, bool keep_series);
  void drain(Slot& slot, bool& all_ok);
  void set_status(const TracerStatus& status);

  MetricStore& store_;
  Builder builder_;
  MetricStore::MetricId tracer_up_, drain_duration_, drain_errors_;
  std::mutex slots_mutex_;  // held while starting, stopping and draining
  std::atomic<bool> exiting_{false};
  std::vector<Slot> slots_;
  mutable std::mutex status_mutex_;  // read by the web server's threads
  std::vector<TracerStatus> statuses_;
};

}  // namespace ebpf_metricsd
