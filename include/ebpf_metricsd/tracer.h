#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
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

// A tracer's section of the config, parsed: made by its descriptor and handed back to the
// same descriptor's create(), so its type is known where it is read (TypedOptions).
class TracerOptions {
 public:
  virtual ~TracerOptions() = default;
};
template <class Options>
struct TypedOptions final : TracerOptions {
  explicit TypedOptions(Options o) : value(std::move(o)) {}
  Options value;
};

// The options of the enabled tracers of a group (tracers that share one BPF object, loaded
// with what all of them ask for), by tracer name.
using TracerPeers = std::map<std::string, std::shared_ptr<const TracerOptions>, std::less<>>;

// The options of peer `name` when it is enabled and its options are an `Options`.
template <class Options>
const Options* peer_options(const TracerPeers& peers, std::string_view name) {
  const auto it = peers.find(name);
  if (it == peers.end()) return nullptr;
  const auto* typed = dynamic_cast<const TypedOptions<Options>*>(it->second.get());
  return typed ? &typed->value : nullptr;
}

// Whose its events are, for the workload labels (`cgroup: true`, cgroup_labels.h).
enum class EventOwner {
  Task,    // a task's: `cgroup` is an option
  None,    // nobody's in particular (kmalloc): no `cgroup` option
  Always,  // always labelled by the owner's cgroup (oom_kills): no `cgroup` option
};

// What a tracer declares beside its options.
struct TracerTraits {
  // Set for tracers with one fixed hook kind (nothing to probe): `hook` must stay auto.
  std::string single_hook = {};
  // Tracers of one group share a BPF object: each gets the others' options (TracerPeers),
  // and a change to any of them restarts them all.
  std::string group = {};
  EventOwner owner = EventOwner::Task;
};

// A tracer as the registry knows it. Adding a tracer = one declare_tracer() + its entry in
// the registry (docs/architecture.md, "Adding a tracer").
struct TracerDescriptor {
  std::string name;
  std::string summary;
  // Reads and validates the tracer's own options (the core reads `enabled` and `hook`).
  // Throws ConfigError.
  std::function<std::shared_ptr<const TracerOptions>(YamlMapReader& section)> parse_options;
  // Builds the tracer (nothing loaded yet) from what parse_options made; its metrics are
  // declared through `scope`, which outlives it.
  std::function<std::unique_ptr<Tracer>(MetricScope& scope, const TracerOptions& options,
                                        const TracerPeers& peers)>
      create;
  TracerTraits traits = {};
};

// Declares tracer T: `parse` reads its section into a T::Options, and T is built from it
// as T(MetricScope&, const T::Options&), or with a group's peers as
// T(MetricScope&, const T::Options&, const TracerPeers&).
template <class T>
TracerDescriptor declare_tracer(std::string name, std::string summary,
                                std::function<typename T::Options(YamlMapReader&)> parse,
                                TracerTraits traits = {}) {
  using Options = typename T::Options;
  return {
      std::move(name), std::move(summary),
      [parse = std::move(parse)](YamlMapReader& section) -> std::shared_ptr<const TracerOptions> {
        return std::make_shared<TypedOptions<Options>>(parse(section));
      },
      [](MetricScope& scope, const TracerOptions& options,
         const TracerPeers& peers) -> std::unique_ptr<Tracer> {
        // Made by the parse_options above: its type is TypedOptions<Options>.
        const Options& o = static_cast<const TypedOptions<Options>&>(options).value;
        if constexpr (std::is_constructible_v<T, MetricScope&, const Options&,
                                              const TracerPeers&>) {
          return std::make_unique<T>(scope, o, peers);
        } else {
          (void)peers;
          return std::make_unique<T>(scope, o);
        }
      },
      std::move(traits)};
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
