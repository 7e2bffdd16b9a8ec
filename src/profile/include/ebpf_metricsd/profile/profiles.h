#pragma once
// What the daemon keeps of stacks, and who fills it: the one Symbolizer every tracer that
// takes stacks uses, the profile store and the slow-event store (storage only), and the
// running profile tracer's cut, which a reader asks for so that a window ending now is
// complete. One instance in the daemon (TracerContext::profiles), shared by the tracers and
// the routes.

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/slow_events.h"
#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

class Profiles {
 public:
  explicit Profiles(ProfileStore::Limits limits = {}) : store_(limits) {}

  ProfileStore& store() { return store_; }
  const ProfileStore& store() const { return store_; }
  SlowEventStore& slow_events() { return slow_events_; }
  Symbolizer& symbolizer() { return symbolizer_; }

  // The running profile tracer reads its kernel maps into a batch of the store when called;
  // set while it runs, cleared (nullptr) before it goes.
  void set_source(std::function<void()> cut);
  // Reads what the kernel side has so far into a batch (when a profile tracer runs), so that
  // a window ending now is complete. False when no profile tracer runs.
  bool cut();
  // Whether a profile tracer runs now (no waiting for a cut in progress).
  bool running() const { return running_; }

 private:
  Symbolizer symbolizer_;
  ProfileStore store_;
  SlowEventStore slow_events_;
  std::mutex source_mutex_;  // held while cutting, and while the source changes
  std::function<void()> source_;
  std::atomic<bool> running_{false};
};

}  // namespace ebpf_metricsd::profiling
