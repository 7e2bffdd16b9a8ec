#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ebpf_metricsd {

// How a BPF program is attached: to a kernel tracepoint (tp_btf, raw_tp), or to the entry
// of a kernel function (fentry; the `tracepoint` argument of a probe then names the function).
enum class HookKind { TpBtf, RawTp, Fentry };
std::string_view hook_name(HookKind kind);

// What the config asks for: probe (auto) or force one kind.
enum class HookPreference { Auto, TpBtf, RawTp };
std::optional<HookPreference> parse_hook_preference(std::string_view text);

// Answers whether a hook kind can really be attached to a tracepoint on this kernel.
class HookProber {
 public:
  virtual ~HookProber() = default;
  virtual bool can_attach(HookKind kind, const std::string& tracepoint) = 0;
  // Why the probe of this pair failed ("" if it succeeded, never ran, or is unknown).
  virtual std::string failure(HookKind /*kind*/, const std::string& /*tracepoint*/) const {
    return "";
  }
};

// Probes by loading a two-instruction program of the kind and attaching it for an instant:
// the only test that also catches kernels where loading works but attaching is refused.
// Results are cached per (kind, tracepoint).
class KernelHookProber : public HookProber {
 public:
  bool can_attach(HookKind kind, const std::string& tracepoint) override;
  std::string failure(HookKind kind, const std::string& tracepoint) const override;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<HookKind, std::string>, std::string> results_;  // "" = attachable
};

// How many arguments the kernel's tracepoint passes (from the btf_trace_<name> typedef in
// the kernel's BTF), for tracepoints whose signature changed across kernels. nullopt when
// the kernel has no BTF for it.
std::optional<int> tracepoint_arg_count(const std::string& tracepoint);
// The C types of the tracepoint's arguments ("struct kmem_cache *", "size_t"), from the same
// BTF typedef, for tracepoints whose arguments changed type across kernels.
std::optional<std::vector<std::string>> tracepoint_arg_types(const std::string& tracepoint);

// The first kind, in preference order (tp_btf before raw_tp), that every tracepoint
// accepts; nullopt when none does.
std::optional<HookKind> choose_hook(HookProber& prober, std::span<const std::string> tracepoints,
                                    HookPreference preference);

// Every kind, in preference order, that every tracepoint accepts; throws BpfError naming
// every refusal when none does.
std::vector<HookKind> usable_hooks(HookProber& prober, std::span<const std::string> tracepoints,
                                   HookPreference preference);

// Calls `start` with each kind in turn until one returns without throwing BpfError, and
// returns that kind: a kind whose attach probe passed can still fail to load (a map type or
// helper its programs need is missing on this kernel, as task storage before 5.12). Each
// failure but the last is logged; when all fail, throws BpfError with every kind's reason.
HookKind start_first_loadable(const std::vector<HookKind>& kinds, const std::string& name,
                              const std::function<void(HookKind)>& start);

// Like choose_hook, but throws BpfError naming every refusal when no kind fits.
HookKind require_hook(HookProber& prober, std::span<const std::string> tracepoints,
                      HookPreference preference);

}  // namespace ebpf_metricsd
