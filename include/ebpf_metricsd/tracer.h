#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/hook_probe.h"

namespace ebpf_metricsd {

class MetricScope;
class YamlMapReader;

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
};

// A tracer as the registry knows it. Adding a tracer = one descriptor + one registry line.
struct TracerDescriptor {
  std::string name;
  std::string summary;
  // Reads and validates the tracer's own options (the core reads `enabled` and `hook`).
  // Throws ConfigError. The result is handed to create() unchanged.
  std::function<std::any(YamlMapReader& options)> parse_options;
  // Builds the tracer (nothing loaded yet); its metrics are declared through `scope`, which
  // outlives it.
  std::function<std::unique_ptr<Tracer>(MetricScope& scope, const std::any& options)> create;
  // Set for tracers with one fixed hook kind (nothing to probe): `hook` must stay auto.
  std::string single_hook = {};
};

// All tracers this build ships, in the order they are started.
const std::vector<TracerDescriptor>& tracer_registry();
const TracerDescriptor* find_tracer(std::string_view name);

struct TracerConfig;
// Builds the tracer a config section names and starts it (loads and attaches its BPF
// side), as the daemon, the tests and the benchmark do. Throws BpfError (the kernel's
// reason) or std::runtime_error.
std::unique_ptr<Tracer> build_tracer(const TracerConfig& config, MetricScope& scope,
                                     HookProber& prober);

}  // namespace ebpf_metricsd
