// page_faults: minor and major page faults, from perf software events with a BPF program.
#include <linux/perf_event.h>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"

// clang-format off
#include <linux/types.h>
#include "page_faults.h"
#include "page_faults.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(page_faults);

class PageFaultsTracer final : public Tracer {
 public:
  using Options = CgroupLabelOptions;
  PageFaultsTracer(MetricScope& scope, const CgroupLabelOptions& cgroup)
      : labels_(cgroup),
        faults_(scope, {{scope.declare(labels_.with_labels(
                           {"ebpf_page_faults_total",
                            "Page faults: minor (no I/O) or major (the page had to be read in).",
                            MetricType::Counter,
                            {"type"}}))}}),
        drops_(scope, drop_reasons<PAGE_FAULT_DROP__COUNT>({"map_full"})) {}

  void start(HookProber&, HookPreference) override {
    skel_ = Object::load(
        "page_faults", drops_,
        [this](page_faults* s) {
          s->rodata->emd_by_cgroup = labels_.on();
          bpf_map__set_max_entries(s->maps.faults_by_cgroup,
                                   labels_.options().kernel_map_entries());
          // Attached below, to a perf event on every CPU.
          return std::vector<ProgramChoice>{{s->progs.minor_fault, true, false},
                                            {s->progs.major_fault, true, false}};
        },
        "perf_event");
    for (int cpu : online_cpus()) {
      links_.push_back(
          attach_perf_sw_event(skel_->progs.minor_fault, PERF_COUNT_SW_PAGE_FAULTS_MIN, cpu));
      links_.push_back(
          attach_perf_sw_event(skel_->progs.major_fault, PERF_COUNT_SW_PAGE_FAULTS_MAJ, cpu));
    }
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    labels_.drain_indexed(
        faults_, skel_->maps.faults_by_cgroup, skel_->maps.faults, PAGE_FAULT__COUNT,
        &page_fault_cgroup_key::type, [](std::uint32_t type) {
          return MetricStore::LabelValues{type == PAGE_FAULT_MINOR ? "minor" : "major"};
        });
    drops_.drain();
  }

 private:
  CgroupLabels labels_;
  SeriesDrain faults_;
  DropAccounting drops_;
  Object skel_;
  std::vector<BpfLink> links_;  // after skel_: detached first
};

}  // namespace

TracerDescriptor page_faults_descriptor() {
  return declare_tracer<PageFaultsTracer>("page_faults", "Page faults, minor and major",
                                          &CgroupLabelOptions::read, {.single_hook = "perf_event"});
}

}  // namespace ebpf_metricsd
