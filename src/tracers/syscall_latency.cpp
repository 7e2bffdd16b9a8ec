// syscall_latency: time from sys_enter to sys_exit per syscall, as a log2 histogram.
#include <algorithm>
#include <array>
#include <set>

#include "ebpf_metricsd/base/syscall_names.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/cgroup_labels.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/profile/slow_capture.h"
#include "ebpf_metricsd/profile/slow_options.h"
#include "ebpf_metricsd/tracers/registry.h"
#include "user_stack.h"

// clang-format off
#include <linux/types.h>
#include "syscall_latency.h"
#include "syscall_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

// The syscalls with series of their own unless the config says otherwise: file and network
// I/O, syncs, waits and memory mapping, what latency questions are about. Every other
// measured syscall is counted in syscall="other".
constexpr const char* kDefaultPerSyscall[] = {
    "read",    "write",   "pread64",    "pwrite64", "readv",    "writev",  "openat",
    "close",   "fsync",   "fdatasync",  "sendto",   "recvfrom", "sendmsg", "recvmsg",
    "connect", "accept4", "epoll_wait", "futex",    "mmap",     "munmap"};

struct SyscallLatencyOptions {
  std::set<int> include;  // empty = all
  std::set<int> exclude;
  std::set<int> per_syscall;  // with series of their own; the rest are "other"
  bool all_per_syscall = false;
  // 1us .. 16s: a syscall faster than a microsecond is not the problem; +Inf takes waits.
  Log2Layout buckets = Log2Layout::seconds(-20, 4);
  CgroupLabelOptions cgroup;
  SlowOptions slow;
};

MetricSpec latency_spec(const Log2Layout& buckets) {
  MetricSpec s;
  s.name = "ebpf_syscall_latency_seconds";
  s.help =
      "Time from syscall entry to exit, by syscall (\"other\": the syscalls without "
      "series of their own).";
  s.type = MetricType::Histogram;
  s.labels = {"syscall"};
  s.buckets = buckets;
  return s;
}

int checked_syscall(YamlMapReader& options, const std::string& key, const std::string& name) {
  const auto nr = syscall_number(name);
  if (!nr) options.fail(key, "unknown syscall " + quoted_excerpt(name));
  if (*nr >= SYSLAT_MAX_SYSCALLS) {
    options.fail(key,
                 "syscall '" + name + "' (" + std::to_string(*nr) + ") is beyond the traced table");
  }
  return *nr;
}

std::set<int> read_syscall_list(YamlMapReader& options, const std::string& key) {
  std::set<int> out;
  for (const auto& name : options.get_string_list(key))
    out.insert(checked_syscall(options, key, name));
  return out;
}

// per_syscall: "all", or a list of names (absent: the default list).
void read_per_syscall(YamlMapReader& options, SyscallLatencyOptions& o) {
  const std::string key = "per_syscall";
  if (options.has(key) && options.node()[key].IsScalar()) {
    const std::string value = options.get_string(key, "");
    if (value != "all")
      options.fail(key, "expected \"all\" or a list of syscalls, got " + quoted_excerpt(value));
    o.all_per_syscall = true;
    return;
  }
  if (options.has(key)) {
    o.per_syscall = read_syscall_list(options, key);
    return;
  }
  for (const char* name : kDefaultPerSyscall) {
    if (const auto nr = syscall_number(name); nr && *nr < SYSLAT_MAX_SYSCALLS)
      o.per_syscall.insert(*nr);
  }
}

using Object = EBPF_METRICSD_SKELETON(syscall_latency);

// Threads with a stamp at once in the raw_tp variant's hash; more count as map_full.
constexpr std::uint32_t kThreadMapEntries = 65536;

class SyscallLatencyTracer final : public Tracer {
 public:
  using Options = SyscallLatencyOptions;
  SyscallLatencyTracer(MetricScope& scope, SyscallLatencyOptions options,
                       const TracerContext& context)
      : scope_(scope),
        options_(std::move(options)),
        labels_(options_.cgroup),
        latency_(scope.declare(labels_.with_labels(latency_spec(options_.buckets)))),
        hists_(scope, {{latency_, SYSLAT_SLOTS}}),
        drops_(scope, drop_reasons<SYSLAT_DROP__COUNT>({"map_full", "unknown_syscall", "map_full",
                                                        "slow_limited", "slow_ring_full"})),
        slow_(scope, latency_, latency_spec(options_.buckets).name, options_.slow, labels_,
              context.profiles, context.walker) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 3> tracepoints = {"sys_enter", "sys_exit",
                                                           "sched_process_exit"};
    skel_ = Object::load_probed(scope_.tracer(), drops_, prober, tracepoints, preference,
                                [this](syscall_latency* s, HookKind k) { return choose(s, k); });
    names_.resize(SYSLAT_MAX_SYSCALLS);
    slow_.start(skel_.get());
  }

  std::vector<HookTwin> choose(syscall_latency* skel, HookKind kind) const {
    for (int nr = 0; nr < SYSLAT_MAX_SYSCALLS; ++nr) {
      const bool wanted = options_.include.empty() || options_.include.count(nr);
      skel->rodata->traced[nr] = wanted && !options_.exclude.count(nr);
    }
    skel->rodata->emd_by_cgroup = labels_.on();
    slow_.configure(skel);
    bpf_map__set_max_entries(skel->maps.hists_by_cgroup, labels_.options().kernel_map_entries());
    const bool btf = kind == HookKind::TpBtf;
    // tp_btf stamps in task storage, raw_tp in a thread-id hash: only one of them is made.
    bpf_map__set_autocreate(skel->maps.start, btf);
    bpf_map__set_max_entries(skel->maps.start_by_tid, btf ? 1 : kThreadMapEntries);
    // Exits before enters: an enter without its exit attached would only leave stale stamps.
    // raw_tp removes the stamps of exiting threads from its hash (task storage goes with
    // the task).
    std::vector<HookTwin> hooks = {{nullptr, skel->progs.thread_exit_raw}};
    for (const HookTwin& t : slow_walker_hooks(skel, options_.slow)) hooks.push_back(t);
    hooks.push_back({skel->progs.sys_exit_btf, skel->progs.sys_exit_raw});
    hooks.push_back({skel->progs.sys_enter_btf, skel->progs.sys_enter_raw});
    return hooks;
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(syscall_latency_hist) == (SYSLAT_SLOTS + 1) * 8);
    slow_.begin_drain();
    labels_.drain_indexed(hists_, skel_->maps.hists_by_cgroup, skel_->maps.hists,
                          SYSLAT_MAX_SYSCALLS, &syscall_latency_cgroup_key::nr,
                          [&](std::uint32_t nr) { return MetricStore::LabelValues{name_of(nr)}; });
    static const std::vector<std::string> names = {"syscall"};
    slow_.drain(
        [&](std::uint64_t nr, std::string_view) {
          return MetricStore::LabelValues{name_of(static_cast<std::uint32_t>(nr))};
        },
        names);
    drops_.drain();
  }

 private:
  const std::string& name_of(std::uint32_t nr) {
    if (nr >= names_.size()) names_.resize(nr + 1);
    if (names_[nr].empty()) {
      const bool own = options_.all_per_syscall || options_.per_syscall.count(static_cast<int>(nr));
      names_[nr] = own ? syscall_name(static_cast<int>(nr)) : "other";
    }
    return names_[nr];
  }

  MetricScope& scope_;
  SyscallLatencyOptions options_;
  CgroupLabels labels_;
  MetricScope::Metric latency_;
  SeriesDrain hists_;
  DropAccounting drops_;
  SlowCapture slow_;
  // Links before the skeleton in destruction order: detach, then unload.
  Object skel_;
  std::vector<std::string> names_;
};

}  // namespace

TracerDescriptor syscall_latency_descriptor() {
  return declare_tracer<SyscallLatencyTracer>("syscall_latency",
                                              "Syscall latency (sys_enter to sys_exit), by syscall",
                                              [](YamlMapReader& options) {
                                                SyscallLatencyOptions o;
                                                o.include = read_syscall_list(options, "include");
                                                o.exclude = read_syscall_list(options, "exclude");
                                                read_per_syscall(options, o);
                                                o.buckets = read_buckets(options, o.buckets);
                                                o.cgroup = CgroupLabelOptions::read(options);
                                                o.slow = SlowOptions::read(options);
                                                return o;
                                              });
}

}  // namespace ebpf_metricsd
