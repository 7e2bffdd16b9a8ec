#include "sched_object.h"

#include <spdlog/spdlog.h>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_labels.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/host_safety.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/skeleton.h"
#include "ebpf_metricsd/slow_capture.h"
#include "ebpf_metricsd/slow_options.h"
#include "ebpf_metricsd/yaml_reader.h"

#include <array>
#include <cstring>
#include <mutex>

namespace ebpf_metricsd {

namespace {
// The newest object, shared by tracers that ask for the same plan.
std::mutex g_mutex;
std::weak_ptr<SchedObject> g_newest;
constexpr std::uint32_t kPidMapEntries = 65536;
}  // namespace

struct SchedObject::Loaded {
  EBPF_METRICSD_SKELETON(scheduler) skel;
};

std::shared_ptr<SchedObject> SchedObject::get(const SchedPlan& plan, HookProber& prober,
                                              DropAccounting& drops) {
  std::lock_guard lock(g_mutex);
  if (auto live = g_newest.lock(); live && live->plan_ == plan) return live;
  std::shared_ptr<SchedObject> obj(new SchedObject(plan));
  // sched_switch gained prev_state in 5.18: the 3-argument programs read it from the task.
  const bool switch_3arg = tracepoint_arg_count("sched_switch").value_or(4) == 3;
  const SchedPlan::Kind& r = plan.kinds[kRunqMap];
  const SchedPlan::Kind& o = plan.kinds[kOffcpuMap];
  static const std::array<std::string, 4> tracepoints = {"sched_wakeup", "sched_wakeup_new",
                                                         "sched_switch", "sched_process_free"};
  obj->loaded_ = std::make_unique<Loaded>();
  obj->loaded_->skel = decltype(Loaded::skel)::load_probed(
      "scheduler", drops, prober, tracepoints, plan.preference, [&](scheduler* s, HookKind kind) {
        const bool btf = kind == HookKind::TpBtf;
        // tp_btf keeps per-task state in task storage, raw_tp in the pid map: one is made.
        bpf_map__set_autocreate(s->maps.tstate, btf);
        bpf_map__set_max_entries(s->maps.tstate_by_pid, btf ? 1 : kPidMapEntries);
        bpf_map__set_max_entries(s->maps.runq_hist_labelled, r.label_sets);
        bpf_map__set_max_entries(s->maps.offcpu_hist_labelled, o.label_sets);
        // Set before load and never after: what the object counts is fixed with it.
        s->bss->sched_cfg = {r.on, r.by_cgroup, r.by_comm, o.on, o.by_cgroup, o.by_comm};
        SlowCapture::configure(s, plan.slow, /*origins=*/0, /*keeps_stacks=*/true);
        auto& p = s->progs;
        // sched_switch first: a wakeup's stamp without the switch that ends it would go stale.
        const std::vector<HookTwin> switches = {
            {p.sched_switch_btf, p.sched_switch_raw, !switch_3arg},
            {p.sched_switch_3arg_btf, p.sched_switch_3arg_raw, switch_3arg},
        };
        const std::vector<HookTwin> wakeups = {
            {p.sched_wakeup_btf, p.sched_wakeup_raw, r.on},
            {p.sched_wakeup_new_btf, p.sched_wakeup_new_raw, r.on},
        };
        obj->switch_programs_ = programs_of(switches, kind);
        obj->wakeup_programs_ = programs_of(wakeups, kind);
        std::vector<HookTwin> hooks = {
            {nullptr, p.sched_free_raw},  // raw_tp: a gone task's state leaves the pid map
        };
        hooks.insert(hooks.end(), switches.begin(), switches.end());
        hooks.insert(hooks.end(), wakeups.begin(), wakeups.end());
        return hooks;
      });
  spdlog::info(
      "scheduler: BPF object loaded for{}{}, labelled maps of {} and {} label sets, slow "
      "off-CPU waits {}",
      r.on ? " runqueue_latency" : "", o.on ? " offcpu_time" : "", r.label_sets, o.label_sets,
      plan.slow.on() ? "from " + std::to_string(plan.slow.threshold_ns) + " ns" : "off");
  g_newest = obj;
  return obj;
}

SchedObject::SchedObject(const SchedPlan& plan) : plan_(plan) {}
SchedObject::~SchedObject() = default;

scheduler* SchedObject::skel() const { return loaded_->skel.get(); }

std::vector<ProgramChoice> SchedObject::programs(bool wakeups) const {
  std::vector<ProgramChoice> programs = switch_programs_;
  if (wakeups) programs.insert(programs.end(), wakeup_programs_.begin(), wakeup_programs_.end());
  return programs;
}
const std::string& SchedObject::hook() const { return loaded_->skel.hook(); }

SchedLabelOptions SchedLabelOptions::read(YamlMapReader& options, const Log2Layout& default_buckets,
                                          bool slow_capture) {
  SchedLabelOptions o;
  o.cgroup = CgroupLabelOptions::read(options);
  o.comm = options.get_bool("comm", false);
  o.buckets = read_buckets(options, default_buckets);
  if (slow_capture) o.slow = SlowOptions::read(options);
  return o;
}

// The workload labels last, as slow events' exemplars name them (SlowCapture::drain).
std::vector<std::string> SchedLabelOptions::names() const {
  std::vector<std::string> n;
  if (comm) n.push_back("comm");
  if (cgroup.on) n.insert(n.end(), {"cgroup", "pod", "container"});
  return n;
}

MetricStore::LabelValues SchedLabelOptions::values(const sched_key& key,
                                                   CgroupLabels& cgroups) const {
  MetricStore::LabelValues v;
  if (comm) v.push_back(fixed_name(key.comm));
  cgroups.append(v, key.cgroup_id);
  return v;
}

namespace {
MetricSpec with_labels(MetricSpec spec, const SchedLabelOptions& labels) {
  for (auto& n : labels.names()) spec.labels.push_back(n);
  spec.buckets = labels.buckets;
  return spec;
}
}  // namespace

namespace {
// The object's plan: each enabled scheduler tracer's part, from its options.
SchedPlan plan_for(const TracerPeers& peers, SchedObject::LabelledMap own,
                   const SchedLabelOptions& own_options) {
  SchedPlan plan;
  const auto add = [&](SchedObject::LabelledMap map, const SchedLabelOptions& o) {
    plan.kinds[map] = {true, o.cgroup.on, o.comm, o.labelled() ? o.cgroup.map_entries : 1u};
    if (map == SchedObject::kOffcpuMap) plan.slow = o.slow;
  };
  for (const auto& [name, map] : {std::pair{"runqueue_latency", SchedObject::kRunqMap},
                                  std::pair{"offcpu_time", SchedObject::kOffcpuMap}}) {
    if (const auto* o = peer_options<SchedLabelOptions>(peers, name)) add(map, *o);
  }
  add(own, own_options);
  return plan;
}
}  // namespace

SchedHistTracer::SchedHistTracer(MetricScope& scope, SchedHistKind kind, SchedLabelOptions labels,
                                 const TracerPeers& peers)
    : kind_(std::move(kind)),
      labels_(labels),
      plan_(plan_for(peers, kind_.map, labels_)),
      metric_(scope.declare(with_labels(kind_.spec, labels_))),
      hist_(scope, {{metric_, SCHED_SLOTS}}),
      drops_(scope, kind_.drop_reasons),
      cgroups_(labels_.cgroup) {}

void SchedHistTracer::start(HookProber& prober, HookPreference preference) {
  plan_.preference = preference;
  obj_ = SchedObject::get(plan_, prober, drops_);
  // Only this kind's tracer reads its maps, and the object was loaded for this start of the
  // group (TracerSet restarts a group whole): what they hold is this tracer's to report.
  drops_.bind(bpf_map__fd(skel()->maps.drops), obj_->programs(kind_.wakeups));
}

void SchedHistTracer::drain() {
  if (labels_.labelled()) {
    cgroups_.begin_pass();
    hist_.drain_hash(
        bpf_map__fd(kind_.labelled_map(skel())), sizeof(sched_key),
        [&](const void* key) {
          return labels_.values(*static_cast<const sched_key*>(key), cgroups_);
        },
        labels_.cgroup.on ? cgroups_.retire([](const void* key) {
          return static_cast<const sched_key*>(key)->cgroup_id;
        })
                          : PerCpuDeltas::Retire{});
  } else {
    hist_.drain_array(bpf_map__fd(kind_.plain_map(skel())), 1,
                      [](const void*) { return MetricStore::LabelValues{}; });
  }
  drops_.drain();
}

}  // namespace ebpf_metricsd
