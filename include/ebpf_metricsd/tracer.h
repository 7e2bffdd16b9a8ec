#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/hook_probe.h"
#include "ebpf_metricsd/map_drain.h"
#include "ebpf_metricsd/metric_store.h"
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
  std::function<std::unique_ptr<Tracer>(MetricStore& store, const std::any& options)> create;
  // Set for tracers with one fixed hook kind (nothing to probe): `hook` must stay auto.
  std::string single_hook = {};
};

// The descriptor of a tracer that has no options of its own (T(MetricStore&)).
template <typename T>
TracerDescriptor descriptor_without_options(std::string name, std::string summary,
                                            std::string single_hook = {}) {
  return {std::move(name), std::move(summary), [](YamlMapReader&) -> std::any { return {}; },
          [](MetricStore& store, const std::any&) -> std::unique_ptr<Tracer> {
            return std::make_unique<T>(store);
          },
          std::move(single_hook)};
}

// All tracers this build ships, in the order they are started.
const std::vector<TracerDescriptor>& tracer_registry();
const TracerDescriptor* find_tracer(std::string_view name);

// Exports a tracer's kernel-side drop counters (a per-CPU array "drops" indexed by reason)
// and the recursion misses of its programs as ebpf_metricsd_dropped_events_total.
class DropAccounting {
 public:
  // reasons[i] names drop code i; "" marks a code that belongs to another tracer sharing
  // the map.
  DropAccounting(MetricStore& store, std::string tracer, std::vector<std::string> reasons,
                 std::string swept_reason = {});
  // Call after load: the map to read (-1: none) and the programs whose misses count (the
  // wanted ones of the list).
  void bind(int drops_map_fd, const std::vector<ProgramChoice>& programs);
  void drain();
  // The next drain takes what the map and programs already counted as its baseline.
  void rebase_next() {
    deltas_.rebase_next();
    rebase_misses_ = true;
  }
  // Deletes stamps older than max_age from an in-flight map (sweep_stale_stamps) and counts
  // them under the swept reason given to the constructor.
  void sweep(int stamps_map_fd, std::chrono::nanoseconds max_age);

 private:
  MetricStore& store_;
  MetricStore::MetricId metric_;
  std::string tracer_;
  std::vector<std::string> reasons_;
  std::string swept_reason_;
  PerCpuDeltas deltas_{1};
  int map_fd_ = -1;
  std::vector<int> prog_fds_;
  std::uint64_t last_misses_ = 0;
  bool rebase_misses_ = false;
};

// Self-metric specs shared by the core.
MetricSpec dropped_events_spec();

}  // namespace ebpf_metricsd
