#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_labels.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/hook_probe.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/slow_options.h"
#include "ebpf_metricsd/yaml_reader.h"

struct bpf_program;

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

// The options of a histogram tracer whose events have an owner: `buckets`, the workload
// labels (`cgroup`, `label_map_entries`) and, where its events have stacks that say why,
// `slow`.
struct OwnedHistogramOptions {
  Log2Layout buckets;
  CgroupLabelOptions cgroup;
  SlowOptions slow;
};

// The descriptor of such a tracer (T(MetricScope&, const OwnedHistogramOptions&)); `slow`:
// it takes the `slow` option.
template <typename T>
TracerDescriptor descriptor_with_owned_histogram(std::string name, std::string summary,
                                                 Log2Layout default_buckets, bool slow = false) {
  return {std::move(name), std::move(summary),
          [default_buckets, slow](YamlMapReader& options) -> std::any {
            OwnedHistogramOptions o{
                read_buckets(options, default_buckets), CgroupLabelOptions::read(options), {}};
            if (slow) o.slow = SlowOptions::read(options);
            return o;
          },
          [](MetricScope& scope, const std::any& options) -> std::unique_ptr<Tracer> {
            return std::make_unique<T>(scope, std::any_cast<const OwnedHistogramOptions&>(options));
          }};
}

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
