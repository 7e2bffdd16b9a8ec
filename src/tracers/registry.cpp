#include "ebpf_metricsd/tracers/registry.h"

#include <stdexcept>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

// Each tracer unit in src/tracers/ defines its descriptor.
TracerDescriptor syscall_latency_descriptor();
TracerDescriptor runqueue_latency_descriptor();
TracerDescriptor offcpu_time_descriptor();
TracerDescriptor page_faults_descriptor();
TracerDescriptor kmalloc_descriptor();
TracerDescriptor tcp_connect_latency_descriptor();
TracerDescriptor net_xmit_latency_descriptor();
TracerDescriptor block_io_descriptor();
TracerDescriptor page_cache_descriptor();
TracerDescriptor oom_kills_descriptor();
TracerDescriptor softirq_latency_descriptor();
TracerDescriptor profile_descriptor();

const std::vector<TracerDescriptor>& tracer_registry() {
  static const std::vector<TracerDescriptor> registry = {
      syscall_latency_descriptor(),  runqueue_latency_descriptor(),
      offcpu_time_descriptor(),      page_faults_descriptor(),
      kmalloc_descriptor(),          tcp_connect_latency_descriptor(),
      net_xmit_latency_descriptor(), block_io_descriptor(),
      page_cache_descriptor(),       oom_kills_descriptor(),
      softirq_latency_descriptor(),  profile_descriptor(),
  };
  return registry;
}

const TracerDescriptor* find_tracer(std::string_view name) {
  for (const auto& d : tracer_registry()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::unique_ptr<Tracer> build_tracer(const TracerConfig& config, MetricScope& scope,
                                     HookProber& prober, const TracerContext& context) {
  const TracerDescriptor* d = find_tracer(config.name);
  if (!d) throw std::runtime_error("no tracer " + config.name + " in this build");
  auto tracer = d->create(scope, *config.options, context);
  const KernelBtfHold btf;  // its hook probes and checks read the kernel's BTF once
  tracer->start(prober, config.hook);
  return tracer;
}

}  // namespace ebpf_metricsd
