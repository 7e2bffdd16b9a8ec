// page_faults: minor and major page faults, from perf software events with a BPF program.
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <spdlog/spdlog.h>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/map_drain.h"
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
  explicit PageFaultsTracer(MetricStore& store)
      : faults_(store, store.declare({"ebpf_page_faults_total",
                                      "Page faults: minor (no I/O) or major (the page had to "
                                      "be read in).",
                                      MetricType::Counter,
                                      {"type"}})),
        drops_(store, "page_faults", {}) {}

  ~PageFaultsTracer() override {
    links_.clear();
    for (int fd : perf_fds_) close(fd);
  }

  void start(HookProber&, HookPreference) override {
    Skeleton skel(page_faults__open_and_load());
    if (!skel) throw BpfError(bpf_error_text("load page_faults", errno));
    for (int cpu : online_cpus()) {
      attach(skel->progs.minor_fault, PERF_COUNT_SW_PAGE_FAULTS_MIN, cpu);
      attach(skel->progs.major_fault, PERF_COUNT_SW_PAGE_FAULTS_MAJ, cpu);
    }
    drops_.bind(-1, {skel->progs.minor_fault, skel->progs.major_fault});
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
  void attach(bpf_program* prog, std::uint64_t config, int cpu) {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_SOFTWARE;
    attr.size = sizeof attr;
    attr.config = config;
    attr.sample_period = 1;  // the program runs on every fault
    const int fd = static_cast<int>(
        syscall(SYS_perf_event_open, &attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) {
      throw BpfError(bpf_error_text("perf_event_open on CPU " + std::to_string(cpu), errno));
    }
    perf_fds_.push_back(fd);
    bpf_link* link = bpf_program__attach_perf_event(prog, fd);
    if (!link) {
      throw BpfError(bpf_error_text(std::string("attach ") + bpf_program__name(prog) +
                                        " on CPU " + std::to_string(cpu),
                                    errno));
    }
    links_.emplace_back(link);
  }

  CounterDrain faults_;
  DropAccounting drops_;
  Skeleton skel_;
  std::vector<BpfLink> links_;
  std::vector<int> perf_fds_;
};

}  // namespace

TracerDescriptor page_faults_descriptor() {
  return {
      "page_faults",
      "Page faults, minor and major",
      [](YamlMapReader&) -> std::any { return {}; },
      [](MetricStore& store, const std::any&) -> std::unique_ptr<Tracer> {
        return std::make_unique<PageFaultsTracer>(store);
      },
      /*single_hook=*/"perf_event",
  };
}

}  // namespace ebpf_metricsd
