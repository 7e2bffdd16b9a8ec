// page_faults: minor and major page faults, from perf software events with a BPF program.
#include <linux/perf_event.h>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_labels.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/host_safety.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/tracer.h"
#include "ebpf_metricsd/yaml_reader.h"

// clang-format off
#include <linux/types.h>
#include "page_faults.h"
#include "page_faults.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Skeleton = SkeletonPtr<page_faults, page_faults__destroy>;

class PageFaultsTracer final : public Tracer {
 public:
  using Options = CgroupLabelOptions;
  PageFaultsTracer(MetricScope& scope, const CgroupLabelOptions& cgroup)
      : labels_(cgroup),
        faults_(scope, scope.declare(labels_.with_labels(
                           {"ebpf_page_faults_total",
                            "Page faults: minor (no I/O) or major (the page had to be read in).",
                            MetricType::Counter,
                            {"type"}}))),
        drops_(scope, drop_reasons<PAGE_FAULT_DROP__COUNT>({"map_full"})) {}

  void start(HookProber&, HookPreference) override {
    Skeleton skel(page_faults__open());
    if (!skel) throw BpfError(bpf_error_text("open page_faults", errno));
    skel->rodata->emd_by_cgroup = labels_.on();
    bpf_map__set_max_entries(skel->maps.faults_by_cgroup, labels_.options().kernel_map_entries());
    make_host_safe(skel->obj, "page_faults");
    if (int err = page_faults__load(skel.get()))
      throw BpfError(bpf_error_text("load page_faults", err));
    for (int cpu : online_cpus()) {
      links_.push_back(
          attach_perf_sw_event(skel->progs.minor_fault, PERF_COUNT_SW_PAGE_FAULTS_MIN, cpu));
      links_.push_back(
          attach_perf_sw_event(skel->progs.major_fault, PERF_COUNT_SW_PAGE_FAULTS_MAJ, cpu));
    }
    drops_.bind(bpf_map__fd(skel->maps.drops),
                {{skel->progs.minor_fault, true}, {skel->progs.major_fault, true}});
    skel_ = std::move(skel);
  }

  std::string hook() const override { return "perf_event"; }

  void drain() override {
    labels_.drain_indexed(
        faults_, bpf_map__fd(skel_->maps.faults_by_cgroup), bpf_map__fd(skel_->maps.faults),
        PAGE_FAULT__COUNT, &page_fault_cgroup_key::type, [](std::uint32_t type) {
          return MetricStore::LabelValues{type == PAGE_FAULT_MINOR ? "minor" : "major"};
        });
    drops_.drain();
  }

 private:
  CgroupLabels labels_;
  CounterDrain faults_;
  DropAccounting drops_;
  Skeleton skel_;
  std::vector<BpfLink> links_;
};

}  // namespace

TracerDescriptor page_faults_descriptor() {
  return declare_tracer<PageFaultsTracer>("page_faults", "Page faults, minor and major",
                                          &CgroupLabelOptions::read, "perf_event");
}

}  // namespace ebpf_metricsd
