// syscall_latency: time from sys_enter to sys_exit per syscall, as a log2 histogram.
#include <algorithm>
#include <array>
#include <set>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/skeleton.h"
#include "ebpf_metricsd/syscall_names.h"
#include "ebpf_metricsd/tracer.h"

// clang-format off
#include <linux/types.h>
#include "syscall_latency.h"
#include "syscall_latency.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

struct SyscallLatencyOptions {
  std::set<int> include;  // empty = all
  std::set<int> exclude;
};

MetricSpec latency_spec() {
  MetricSpec s;
  s.name = "ebpf_syscall_latency_seconds";
  s.help = "Time from syscall entry to exit, by syscall.";
  s.type = MetricType::Histogram;
  s.labels = {"syscall"};
  // 32 ns .. 2^36 ns (68.7 s); longer goes to +Inf only.
  s.buckets = {1e9, 5, 36};
  return s;
}

std::set<int> read_syscall_list(YamlMapReader& options, const std::string& key) {
  std::set<int> out;
  for (const auto& name : options.get_string_list(key)) {
    const auto nr = syscall_number(name);
    if (!nr) options.fail(key, "unknown syscall '" + name + "'");
    if (*nr >= SYSLAT_MAX_SYSCALLS) {
      options.fail(
          key, "syscall '" + name + "' (" + std::to_string(*nr) + ") is beyond the traced table");
    }
    out.insert(*nr);
  }
  return out;
}

using Object = EBPF_METRICSD_SKELETON(syscall_latency);

// Threads with a stamp at once in the raw_tp variant's hash; more count as map_full.
constexpr std::uint32_t kThreadMapEntries = 65536;

class SyscallLatencyTracer final : public Tracer {
 public:
  SyscallLatencyTracer(MetricScope& scope, SyscallLatencyOptions options)
      : scope_(scope),
        options_(std::move(options)),
        hists_(scope, scope.declare(latency_spec()), SYSLAT_SLOTS),
        drops_(scope, drop_reasons<SYSLAT_DROP__COUNT>({"map_full", "unknown_syscall"})) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 3> tracepoints = {"sys_enter", "sys_exit",
                                                           "sched_process_exit"};
    HookKind kind{};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tracepoints, preference,
        [this](syscall_latency* s, HookKind k) { return choose(s, k); }, kind);
    hook_ = std::string(hook_name(kind));
    names_.resize(SYSLAT_MAX_SYSCALLS);
  }

  std::vector<ProgramChoice> choose(syscall_latency* skel, HookKind kind) const {
    for (int nr = 0; nr < SYSLAT_MAX_SYSCALLS; ++nr) {
      const bool wanted = options_.include.empty() || options_.include.count(nr);
      skel->rodata->traced[nr] = wanted && !options_.exclude.count(nr);
    }
    const bool btf = kind == HookKind::TpBtf;
    // tp_btf stamps in task storage, raw_tp in a thread-id hash: only one of them is made.
    bpf_map__set_autocreate(skel->maps.start, btf);
    bpf_map__set_max_entries(skel->maps.start_by_tid, btf ? 1 : kThreadMapEntries);
    // Exits before enters: an enter without its exit attached would only leave stale stamps.
    return {
        {skel->progs.sys_exit_btf, btf},     {skel->progs.sys_enter_btf, btf},
        {skel->progs.thread_exit_raw, !btf}, {skel->progs.sys_exit_raw, !btf},
        {skel->progs.sys_enter_raw, !btf},
    };
  }

  std::string hook() const override { return hook_; }

  void drain() override {
    static_assert(sizeof(syscall_latency_hist) == (SYSLAT_SLOTS + 1) * 8);
    hists_.drain_array(bpf_map__fd(skel_->maps.hists), SYSLAT_MAX_SYSCALLS, [&](const void* key) {
      const std::uint32_t nr = *static_cast<const std::uint32_t*>(key);
      if (names_[nr].empty()) names_[nr] = syscall_name(static_cast<int>(nr));
      return MetricStore::LabelValues{names_[nr]};
    });
    drops_.drain();
  }

 private:
  MetricScope& scope_;
  SyscallLatencyOptions options_;
  Log2HistDrain hists_;
  DropAccounting drops_;
  // Links before the skeleton in destruction order: detach, then unload.
  Object skel_;
  std::string hook_;
  std::vector<std::string> names_;
};

}  // namespace

TracerDescriptor syscall_latency_descriptor() {
  return {
      "syscall_latency",
      "Syscall latency (sys_enter to sys_exit), by syscall",
      [](YamlMapReader& options) -> std::any {
        SyscallLatencyOptions o;
        o.include = read_syscall_list(options, "include");
        o.exclude = read_syscall_list(options, "exclude");
        return o;
      },
      [](MetricScope& scope, const std::any& options) -> std::unique_ptr<Tracer> {
        return std::make_unique<SyscallLatencyTracer>(
            scope, std::any_cast<const SyscallLatencyOptions&>(options));
      },
  };
}

}  // namespace ebpf_metricsd
