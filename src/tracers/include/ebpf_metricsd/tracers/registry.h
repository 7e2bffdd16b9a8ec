#pragma once
// The tracers this build ships: each declared once (declare_tracer in its unit under
// src/tracers/) and listed in one table (registry.cpp). Everything else that lists tracers
// reads the table or is checked against it.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/core/tracer.h"

namespace ebpf_metricsd {

class MetricScope;
class YamlMapReader;

namespace profiling {
class Profiles;
class Walker;
}  // namespace profiling

// What a tracer may use beside its own maps and metrics, given by whoever builds it (the
// daemon, a test): where stacks are kept and symbolized (nullptr: nowhere; the profile
// tracer then refuses to start; slow events keep exemplars and an own store), and the walk
// of user stacks in the kernel that every tracer shares (nullptr: a tracer that walks makes
// its own).
struct TracerContext {
  profiling::Profiles* profiles = nullptr;
  profiling::Walker* walker = nullptr;
};

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
  EventOwner owner = EventOwner::Task;
};

// A tracer's options as its descriptor parsed them: T::Options, typed where it is read.
template <class Options>
struct TypedOptions final : TracerOptions {
  explicit TypedOptions(Options o) : value(std::move(o)) {}
  Options value;
};

struct TracerDescriptor {
  std::string name;
  std::string summary;
  // Reads and validates the tracer's own options (the config parser reads `enabled` and
  // `hook`). Throws ConfigError.
  std::function<std::shared_ptr<const TracerOptions>(YamlMapReader& section)> parse_options;
  // Builds the tracer (nothing loaded yet) from what parse_options made; its metrics are
  // declared through `scope`, which outlives it.
  std::function<std::unique_ptr<Tracer>(MetricScope& scope, const TracerOptions& options,
                                        const TracerContext& context)>
      create;
  TracerTraits traits = {};
};

// Declares tracer T: `parse` reads its section into a T::Options, and T is built from it as
// T(MetricScope&, const T::Options&), or T(MetricScope&, const T::Options&,
// const TracerContext&) when it uses the context.
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
         const TracerContext& context) -> std::unique_ptr<Tracer> {
        // Made by the parse_options above: its type is TypedOptions<Options>.
        const Options& o = static_cast<const TypedOptions<Options>&>(options).value;
        if constexpr (std::is_constructible_v<T, MetricScope&, const Options&,
                                              const TracerContext&>) {
          return std::make_unique<T>(scope, o, context);
        } else {
          (void)context;
          return std::make_unique<T>(scope, o);
        }
      },
      std::move(traits)};
}

// All tracers this build ships, in the order they are started.
const std::vector<TracerDescriptor>& tracer_registry();
const TracerDescriptor* find_tracer(std::string_view name);

// Builds the tracer a config section names and starts it (loads and attaches its BPF
// side), as the daemon, the tests and the benchmark do. Throws BpfError (the kernel's
// reason) or std::runtime_error.
std::unique_ptr<Tracer> build_tracer(const TracerConfig& config, MetricScope& scope,
                                     HookProber& prober, const TracerContext& context = {});

}  // namespace ebpf_metricsd
