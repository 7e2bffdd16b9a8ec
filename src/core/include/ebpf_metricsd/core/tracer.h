#pragma once
// The tracer contract as the core runs it: a tracer loads its BPF side, names the hook kind
// it chose and drains its maps into its MetricScope. What tracers exist, their options and
// how one is built are the tracers layer's (ebpf_metricsd/tracers/registry.h).

#include <memory>
#include <string>

#include "ebpf_metricsd/bpf/hook_probe.h"

namespace ebpf_metricsd {

// One tracer: a BPF object in the kernel plus the code that turns its maps into series.
class Tracer {
 public:
  virtual ~Tracer() = default;
  // Opens, loads and attaches the BPF side, choosing hooks with `prober` under
  // `preference`. Throws BpfError with the kernel's reason; the destructor detaches.
  virtual void start(HookProber& prober, HookPreference preference) = 0;
  // The hook kind chosen by start(), e.g. "tp_btf".
  virtual std::string hook() const = 0;
  // Reads the maps and adds everything that happened since the previous drain to the store.
  virtual void drain() = 0;
  // The daemon is exiting and nothing drained from now on is served: work in progress
  // (a drain, a reader thread) may end at once. Called from another thread than drain()'s.
  virtual void abandon() {}
};

// A tracer's own options, parsed from its config section by its descriptor and handed back
// to the same descriptor when the tracer is built; opaque to the core.
class TracerOptions {
 public:
  virtual ~TracerOptions() = default;
};

// A tracer's section of the config, parsed.
struct TracerConfig {
  std::string name;
  std::string summary;  // one line, for the landing page
  bool enabled = false;
  HookPreference hook = HookPreference::Auto;
  std::shared_ptr<const TracerOptions> options;
  // The section as written (canonical YAML): a reload restarts the tracer only when this
  // changed.
  std::string fingerprint;
};

}  // namespace ebpf_metricsd
