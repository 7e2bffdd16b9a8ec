#pragma once
// The one step that brings a tracer's BPF object into the kernel: open the bpftool skeleton
// (CO-RE against the kernel's BTF, or btf_path), set it up, apply the host-safety rule
// (host_safety.h), load it, attach the programs this start uses and bind the tracer's drop
// accounting. The result owns all of it.

#include <bpf/libbpf.h>

#include <cerrno>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/hook_probe.h"
#include "ebpf_metricsd/bpf/host_safety.h"

namespace ebpf_metricsd {

// One hook of a tracer in both kinds: the tp_btf and the raw_tp program of one tracepoint,
// side by side in its .bpf.c (null where a kind has none, as a raw_tp-only cleanup hook; the
// same program twice for one that serves both, as a perf event or fentry program).
// `wanted` false: this start does not use it; `attach` false: the tracer attaches it itself.
struct HookTwin {
  bpf_program* btf;
  bpf_program* raw;
  bool wanted = true;
  bool attach = true;
};

// The programs of `kind` among `twins` in their order (the attach order), the others'
// autoload off.
std::vector<ProgramChoice> programs_of(std::span<const HookTwin> twins, HookKind kind);

// Makes the per-task state of bpf/common/task_state.bpf.h for hook kind `kind`: task storage
// with tp_btf, else the thread-id hash (65536 threads); neither (both left minimal) when the
// start does not use it.
inline void configure_task_state(bpf_map* task_storage, bpf_map* by_tid, HookKind kind,
                                 bool used = true) {
  const bool btf = used && kind == HookKind::TpBtf;
  bpf_map__set_autocreate(task_storage, btf);
  bpf_map__set_max_entries(by_tid, used && !btf ? 65536 : 1);
}

// The programs of one sched_switch handler as EMD_SCHED_SWITCH_PROGS defines them
// (bpf/common/sched_switch.bpf.h): the pair for the argument list the kernel's BTF shows
// (prev_state is passed since 5.18, and read from the task before).
inline std::vector<HookTwin> sched_switch_twins(bpf_program* btf, bpf_program* raw,
                                                bpf_program* btf_3arg, bpf_program* raw_3arg,
                                                bool wanted = true) {
  const bool three_args = tracepoint_arg_count("sched_switch").value_or(4) == 3;
  return {{btf, raw, wanted && !three_args}, {btf_3arg, raw_3arg, wanted && three_args}};
}
#define EBPF_METRICSD_SCHED_SWITCH_TWINS(progs, name, ...)                    \
  ::ebpf_metricsd::sched_switch_twins((progs).name##_btf, (progs).name##_raw, \
                                      (progs).name##_3arg_btf,                \
                                      (progs).name##_3arg_raw __VA_OPT__(, ) __VA_ARGS__)

template <typename Skel, Skel* (*Open)(const bpf_object_open_opts*), int (*Load)(Skel*),
          void (*Destroy)(Skel*)>
class LoadedSkeleton {
 public:
  // Sets read-only data and map sizes on the opened skeleton and says which programs this
  // start uses, in attach order.
  using Choose = std::function<std::vector<ProgramChoice>(Skel*)>;

  LoadedSkeleton() = default;

  // Throws BpfError naming `tracer` and the kernel's reason. `drops` reads the object's drop
  // maps, and the recursion misses of the chosen programs.
  // `hook`: what hook() says (the one kind of its programs, e.g. "perf_event").
  static LoadedSkeleton load(const std::string& tracer, DropAccounting& drops, const Choose& choose,
                             const std::string& hook) {
    std::string btf_path;
    const auto open_opts = skeleton_open_opts(btf_path);
    LoadedSkeleton l;
    l.skel_.reset(Open(&open_opts));
    if (!l.skel_) throw BpfError(bpf_error_text("open " + tracer, errno));
    const std::vector<ProgramChoice> programs = choose(l.skel_.get());
    l.links_ = load_and_attach(
        programs,
        [&] {
          make_host_safe(l.skel_->obj, tracer);
          return Load(l.skel_.get());
        },
        tracer);
    drops.bind(l.skel_->obj, programs);
    l.hook_ = hook;
    return l;
  }

  // load() with probing first: the hook kinds every tracepoint of `tracepoints` accepts
  // under `preference`, best first, and the first kind whose object loads (a kind can pass
  // its attach probe and still fail to load where a map type or helper it needs is missing).
  // `setup` sets the opened skeleton up for the kind it gets and returns the tracer's hooks;
  // hook() then names the kind in use.
  using Setup = std::function<std::vector<HookTwin>(Skel*, HookKind)>;
  static LoadedSkeleton load_probed(const std::string& tracer, DropAccounting& drops,
                                    HookProber& prober, std::span<const std::string> tracepoints,
                                    HookPreference preference, const Setup& setup) {
    LoadedSkeleton l;
    start_first_loadable(usable_hooks(prober, tracepoints, preference), tracer, [&](HookKind k) {
      l = load(
          tracer, drops, [&](Skel* s) { return programs_of(setup(s, k), k); },
          std::string(hook_name(k)));
    });
    return l;
  }

  // The hook kind in use, as tracer_up{hook} shows it.
  const std::string& hook() const { return hook_; }
  Skel* operator->() const { return skel_.get(); }
  Skel* get() const { return skel_.get(); }
  explicit operator bool() const { return static_cast<bool>(skel_); }

 private:
  SkeletonPtr<Skel, Destroy> skel_;
  std::vector<BpfLink> links_;  // declared after skel_: detached before it is unloaded
  std::string hook_;
};

// The LoadedSkeleton type of the bpftool skeleton `name` (bpf/<name>.bpf.c).
#define EBPF_METRICSD_SKELETON(name) \
  ::ebpf_metricsd::LoadedSkeleton<name, name##__open_opts, name##__load, name##__destroy>

}  // namespace ebpf_metricsd
