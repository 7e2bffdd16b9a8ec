// page_faults: minor and major page faults, from perf software events with a BPF program.
#include <linux/perf_event.h>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/tracer.h"

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
  explicit PageFaultsTracer(MetricScope& scope)
      : faults_(scope, scope.declare({"ebpf_page_faults_total",
                                      "Page faults: minor (no I/O) or major (the page had to "
                                      "be read in).",
                                      MetricType::Counter,
                                      {"type"}})),
        drops_(scope, {}) {}

  void start(HookProber&, HookPreference) override {
    Skeleton skel(page_faults__open_and_load());
    if (!skel) throw BpfError(bpf_error_text("load page_faults", errno));
    for (int cpu : online_cpus()) {
      links_.push_back(
          attach_perf_sw_event(skel->progs.minor_fault, PERF_COUNT_SW_PAGE_FAULTS_MIN, cpu));
      links_.push_back(
          attach_perf_sw_event(skel->progs.major_fault, PERF_COUNT_SW_PAGE_FAULTS_MAJ, cpu));
    }
    drops_.bind(-1, {{skel->progs.minor_fault, true}, {skel->progs.major_fault, true}});
    skel_ = std::move(skel);
  }

  std::string hook() const override { return "perf_event"; }

  void drain() override {
    faults_.drain_array(bpf_map__fd(skel_->maps.faults), PAGE_FAULT__COUNT, [](const void* key) {
      const auto k = *static_cast<const std::uint32_t*>(key);
      return MetricStore::LabelValues{k == PAGE_FAULT_MINOR ? "minor" : "major"};
    });
    drops_.drain();
  }

 private:
  CounterDrain faults_;
  DropAccounting drops_;
  Skeleton skel_;
  std::vector<BpfLink> links_;
};

}  // namespace

TracerDescriptor page_faults_descriptor() {
  return descriptor_without_options<PageFaultsTracer>("page_faults", "Page faults, minor and major",
                                                      "perf_event");
}

}  // namespace ebpf_metricsd
