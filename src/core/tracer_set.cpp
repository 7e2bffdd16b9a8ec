#include "ebpf_metricsd/core/tracer_set.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "ebpf_metricsd/base/clock.h"

namespace ebpf_metricsd {

TracerSet::TracerSet(MetricStore& store, Builder builder)
    : store_(store),
      builder_(std::move(builder)),
      tracer_up_(store.declare(
          {"ebpf_metricsd_tracer_up",
           "1 when the tracer is attached, 0 when it failed; hook is the attach type in use.",
           MetricType::Gauge,
           {"tracer", "hook"}})),
      drain_duration_(store.declare({"ebpf_metricsd_drain_duration_seconds",
                                     "How long the last drain of a tracer's maps took.",
                                     MetricType::Gauge,
                                     {"tracer"}})),
      drain_errors_(store.declare({"ebpf_metricsd_drain_errors_total",
                                   "Drains of a tracer's maps that failed.",
                                   MetricType::Counter,
                                   {"tracer"}})) {}

TracerSet::~TracerSet() { stop_all(); }

std::vector<std::string> TracerSet::apply(const std::vector<TracerConfig>& configs) {
  std::lock_guard lock(slots_mutex_);
  std::vector<std::string> failed;
  for (const TracerConfig& tc : configs) {
    auto it = std::find_if(slots_.begin(), slots_.end(),
                           [&](const Slot& s) { return s.config.name == tc.name; });
    if (!tc.enabled) {
      if (it != slots_.end()) {
        spdlog::info("tracer {} disabled: detaching", tc.name);
        stop(*it, /*keep_series=*/false);
        slots_.erase(it);
      }
      set_status({tc.name, tc.summary, false, false, "", ""});
      continue;
    }
    if (it != slots_.end()) {
      const bool unchanged = it->config.fingerprint == tc.fingerprint;
      if (unchanged && it->tracer) continue;
      spdlog::info("tracer {}{}: restarting", tc.name, unchanged ? "" : " options changed");
      stop(*it, /*keep_series=*/true);
      it->config = tc;
    } else {
      slots_.push_back({tc, std::make_unique<MetricScope>(store_, tc.name), nullptr});
      it = slots_.end() - 1;
    }
    start(*it);
    if (!it->tracer) failed.push_back(tc.name);
  }
  return failed;
}

void TracerSet::start(Slot& slot) {
  const std::string& name = slot.config.name;
  std::string hook = "none", error;
  try {
    slot.tracer = builder_(slot.config, *slot.scope);
    hook = slot.tracer->hook();
  } catch (const std::exception& e) {
    error = e.what();
    slot.tracer.reset();
    // Nothing of a tracer that is not up is exported but its tracer_up 0.
    store_.release_owner(name);
    store_.erase_series_with("tracer", name);
  }
  // What an earlier instance declared and this one does not goes now.
  store_.drop_unowned();
  store_.set(tracer_up_, {name, hook}, error.empty() ? 1 : 0);
  set_status({name, slot.config.summary, true, error.empty(), hook, error});
  if (!error.empty()) {
    spdlog::error("tracer {} failed to start: {}", name, error);
    return;
  }
  store_.add(drain_errors_, {name}, 0);
  spdlog::info("tracer {} attached via {}", name, hook);
}

void TracerSet::detach(Slot& slot) {
  if (!slot.tracer) return;
  bool ok = true;
  drain(slot, ok);      // what it counted since the last drain is not lost
  slot.tracer.reset();  // detaches and unloads its BPF side
}

void TracerSet::stop(Slot& slot, bool keep_series) {
  const std::string& name = slot.config.name;
  detach(slot);
  store_.release_owner(name);
  store_.erase_series_with(tracer_up_, "tracer", name);
  if (keep_series) return;
  store_.erase_series_with("tracer", name);
  store_.drop_unowned();
}

bool TracerSet::drain() {
  std::lock_guard lock(slots_mutex_);
  bool all_ok = true;
  for (Slot& slot : slots_) {
    if (exiting_) break;
    if (slot.tracer) drain(slot, all_ok);
  }
  return all_ok;
}

void TracerSet::drain(Slot& slot, bool& all_ok) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    slot.tracer->drain();
  } catch (const std::exception& e) {
    all_ok = false;
    store_.add(drain_errors_, {slot.config.name}, 1);
    spdlog::error("drain of tracer {} failed: {}", slot.config.name, e.what());
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  store_.set(drain_duration_, {slot.config.name}, took.count());
}

void TracerSet::begin_exit() {
  exiting_ = true;
  // Without slots_mutex_, which a drain in progress holds: the slots change only in apply()
  // and stop_all(), on this same thread.
  for (Slot& slot : slots_)
    if (slot.tracer) slot.tracer->abandon();
}

void TracerSet::stop_all() {
  std::lock_guard lock(slots_mutex_);
  for (Slot& slot : slots_) {
    if (!slot.tracer) continue;
    bool ok = true;
    if (!exiting_) drain(slot, ok);
    const std::uint64_t t0 = monotonic_ns();
    slot.tracer.reset();
    spdlog::debug("tracer {} stopped in {} ms", slot.config.name,
                  (monotonic_ns() - t0) / 1'000'000);
  }
  slots_.clear();
}

void TracerSet::set_status(const TracerStatus& status) {
  std::lock_guard lock(status_mutex_);
  for (auto& s : statuses_) {
    if (s.name == status.name) {
      s = status;
      return;
    }
  }
  statuses_.push_back(status);
}

std::vector<TracerStatus> TracerSet::statuses() const {
  std::lock_guard lock(status_mutex_);
  return statuses_;
}

std::size_t TracerSet::running() const {
  std::lock_guard lock(status_mutex_);
  return static_cast<std::size_t>(std::count_if(statuses_.begin(), statuses_.end(),
                                                [](const TracerStatus& s) { return s.up; }));
}

std::size_t TracerSet::enabled() const {
  std::lock_guard lock(status_mutex_);
  return static_cast<std::size_t>(std::count_if(statuses_.begin(), statuses_.end(),
                                                [](const TracerStatus& s) { return s.enabled; }));
}

}  // namespace ebpf_metricsd
