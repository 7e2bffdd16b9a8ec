#pragma once
// Options that several tracers share, and the descriptor of a tracer made of them.

#include <memory>
#include <string>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/profile/slow_options.h"
#include "ebpf_metricsd/tracers/registry.h"

namespace ebpf_metricsd {

// The options of a histogram tracer whose events have an owner: `buckets`, the workload
// labels (`cgroup`, `label_map_entries`) and, where its events have stacks that say why,
// `slow`.
struct OwnedHistogramOptions {
  Log2Layout buckets;
  CgroupLabelOptions cgroup;
  SlowOptions slow;
};

// The descriptor of such a tracer (T::Options is OwnedHistogramOptions); `slow`: it takes
// the `slow` option.
template <typename T>
TracerDescriptor descriptor_with_owned_histogram(std::string name, std::string summary,
                                                 Log2Layout default_buckets, bool slow = false) {
  return declare_tracer<T>(
      std::move(name), std::move(summary), [default_buckets, slow](YamlMapReader& options) {
        OwnedHistogramOptions o{
            read_buckets(options, default_buckets), CgroupLabelOptions::read(options), {}};
        if (slow) o.slow = SlowOptions::read(options);
        return o;
      });
}

}  // namespace ebpf_metricsd
