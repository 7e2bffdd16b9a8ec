#pragma once
// A histogram of tasks' waits, labelled on request by the task's comm (`comm: true`) and
// workload (`cgroup: true`): runqueue_latency's and offcpu_time's. The kernel side is
// bpf/common/task_labels.bpf.h: a per-CPU array of one histogram, or a per-CPU hash by
// label set (struct emd_task_key) holding `label_map_entries` sets.

#include <bpf/libbpf.h>

#include <string>
#include <vector>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/slow_options.h"

// clang-format off
#include <linux/types.h>
#include "common/log2_slot.h"
#include "common/task_labels.h"
// clang-format on

namespace ebpf_metricsd {

struct TaskHistogramOptions {
  Log2Layout buckets;
  CgroupLabelOptions cgroup;  // `cgroup`, and `label_map_entries` for either label
  bool comm = false;
  SlowOptions slow;  // where the tracer takes `slow`
  static TaskHistogramOptions read(YamlMapReader& options, const Log2Layout& default_buckets,
                                   bool slow_capture) {
    TaskHistogramOptions o;
    o.cgroup = CgroupLabelOptions::read(options);
    o.comm = options.get_bool("comm", false);
    o.buckets = read_buckets(options, default_buckets);
    if (slow_capture) o.slow = SlowOptions::read(options);
    return o;
  }
  bool labelled() const { return cgroup.on || comm; }
  // The label names: comm, then the workload labels (as slow events' exemplars name them).
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    if (comm) n.push_back("comm");
    if (cgroup.on) n.insert(n.end(), {"cgroup", "pod", "container"});
    return n;
  }
};

class TaskHistogram {
 public:
  // `spec`: the metric without labels or buckets; the options add them.
  TaskHistogram(MetricScope& scope, MetricSpec spec, const TaskHistogramOptions& options)
      : options_(options),
        metric_(scope.declare(with_options(std::move(spec), options))),
        drain_(scope, {{metric_, EMD_HIST_SLOTS}}),
        cgroups_(options.cgroup) {}

  MetricScope::Metric metric() const { return metric_; }
  CgroupLabels& cgroups() { return cgroups_; }

  // Before load: the labels the kernel side keys by, and the size of its `labelled` map.
  template <class Skel>
  void configure(Skel* s, bpf_map* labelled) const {
    s->rodata->emd_by_cgroup = options_.cgroup.on;
    s->rodata->emd_by_comm = options_.comm;
    bpf_map__set_max_entries(labelled, options_.labelled() ? options_.cgroup.map_entries : 1);
  }

  void drain(const bpf_map* plain, const bpf_map* labelled) {
    if (!options_.labelled()) {
      drain_.drain_array(plain, 1, [](const void*) { return MetricStore::LabelValues{}; });
      return;
    }
    cgroups_.begin_pass();
    drain_.drain_hash(
        labelled, sizeof(emd_task_key),
        [&](const void* key) {
          const auto& k = *static_cast<const emd_task_key*>(key);
          MetricStore::LabelValues v;
          if (options_.comm) v.push_back(fixed_name(k.comm));
          cgroups_.append(v, k.cgroup);
          return v;
        },
        options_.cgroup.on ? cgroups_.retire([](const void* key) {
          return static_cast<const emd_task_key*>(key)->cgroup;
        })
                           : PerCpuDeltas::Retire{});
  }

 private:
  static MetricSpec with_options(MetricSpec spec, const TaskHistogramOptions& options) {
    for (auto& n : options.names()) spec.labels.push_back(n);
    spec.buckets = options.buckets;
    return spec;
  }
  TaskHistogramOptions options_;
  MetricScope::Metric metric_;
  SeriesDrain drain_;
  CgroupLabels cgroups_;
};

}  // namespace ebpf_metricsd
