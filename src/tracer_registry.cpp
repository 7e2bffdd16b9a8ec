#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <numeric>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/tracer.h"

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

const std::vector<TracerDescriptor>& tracer_registry() {
  static const std::vector<TracerDescriptor> registry = {
      syscall_latency_descriptor(),  runqueue_latency_descriptor(),
      offcpu_time_descriptor(),      page_faults_descriptor(),
      kmalloc_descriptor(),          tcp_connect_latency_descriptor(),
      net_xmit_latency_descriptor(), block_io_descriptor(),
      page_cache_descriptor(),
  };
  return registry;
}

const TracerDescriptor* find_tracer(std::string_view name) {
  for (const auto& d : tracer_registry()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

MetricSpec dropped_events_spec() {
  return {"ebpf_metricsd_dropped_events_total",
          "Kernel events a tracer saw but could not record, by reason.",
          MetricType::Counter,
          {"tracer", "reason"}};
}

DropAccounting::DropAccounting(MetricStore& store, std::string tracer,
                               std::vector<std::string> reasons, std::string swept_reason)
    : store_(store),
      metric_(store.declare(dropped_events_spec())),
      tracer_(std::move(tracer)),
      reasons_(std::move(reasons)),
      swept_reason_(std::move(swept_reason)) {
  if (!swept_reason_.empty()) store_.add(metric_, {tracer_, swept_reason_}, 0);
  // Zero series up front, so "no drops" is visible rather than absent.
  for (const auto& r : reasons_) {
    if (!r.empty()) store_.add(metric_, {tracer_, r}, 0);
  }
  store_.add(metric_, {tracer_, "recursion"}, 0);
}

void DropAccounting::bind(int drops_map_fd, const std::vector<ProgramChoice>& programs) {
  map_fd_ = drops_map_fd;
  prog_fds_.clear();
  for (const auto& p : programs) {
    if (p.wanted) prog_fds_.push_back(bpf_program__fd(p.prog));
  }
}

void DropAccounting::drain() {
  if (map_fd_ >= 0) {
    deltas_.drain_array(map_fd_, static_cast<std::uint32_t>(reasons_.size()),
                        [&](const void* key, const std::uint64_t* delta) {
                          const auto& reason = reasons_[*static_cast<const std::uint32_t*>(key)];
                          if (!reason.empty()) store_.add(metric_, {tracer_, reason}, delta[0]);
                        });
  }
  // The kernel skips a program that would re-enter itself on one CPU (e.g. from NMI) and
  // counts that as a recursion miss: an event this tracer did not see.
  std::uint64_t misses = 0;
  for (int fd : prog_fds_) {
    bpf_prog_info info{};
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) misses += info.recursion_misses;
  }
  if (misses > last_misses_ && !rebase_misses_) {
    store_.add(metric_, {tracer_, "recursion"}, misses - last_misses_);
  }
  last_misses_ = misses;
  rebase_misses_ = false;
}

void DropAccounting::sweep(int stamps_map_fd, std::chrono::nanoseconds max_age) {
  if (const auto n = sweep_stale_stamps(stamps_map_fd, max_age)) {
    store_.add(metric_, {tracer_, swept_reason_}, n);
  }
}

}  // namespace ebpf_metricsd
