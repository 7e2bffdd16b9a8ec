#include "sched_object.h"

#include <spdlog/spdlog.h>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/cgroup_labels.h"
#include "ebpf_metricsd/drop_accounting.h"
#include "ebpf_metricsd/host_safety.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/map_deltas.h"
#include "ebpf_metricsd/metric_scope.h"
#include "ebpf_metricsd/slow_capture.h"
#include "ebpf_metricsd/slow_options.h"
#include "ebpf_metricsd/yaml_reader.h"

#include <array>
#include <cstring>
#include <mutex>

namespace ebpf_metricsd {

namespace {
std::mutex g_mutex;
std::weak_ptr<SchedObject> g_live;
constexpr std::uint32_t kPidMapEntries = 65536;
}  // namespace

std::shared_ptr<SchedObject> SchedObject::acquire(HookProber& prober, HookPreference preference,
                                                  SchedHistTracer& user, bool& fresh) {
  std::lock_guard lock(g_mutex);
  const LabelledMap map = user.labelled_map();
  const std::optional<std::uint32_t> wanted = user.label_sets();
  std::shared_ptr<SchedObject> live = g_live.lock();
  fresh = false;
  const std::optional<SlowOptions> slow = user.slow_capture();
  if (live && (!wanted || live->entries_[map] == *wanted) && (!slow || live->slow_ == *slow)) {
    live->users_.push_back(&user);
    return live;
  }
  fresh = true;

  std::shared_ptr<SchedObject> obj(new SchedObject());
  // A map no tracer labels yet: full size where entries are allocated on first use (free
  // until used), one entry where the kernel's hash maps must be preallocated
  // (host_safety.h), so that an unlabelled tracer costs no memory there; a labelled one
  // joining later reloads the object with its size.
  const std::uint32_t unlabelled = kernel_allocators().hash_elements ? SCHED_MAX_LABEL_SETS : 1;
  obj->entries_ = live ? live->entries_ : MapEntries{unlabelled, unlabelled};
  if (wanted) obj->entries_[map] = *wanted;
  // offcpu_time's capture: the one it asks for, else the live object's while it uses it.
  obj->slow_ = slow ? *slow : SlowOptions{};
  if (!slow && live) {
    for (const SchedHistTracer* other : live->users_) {
      if (const auto s = other->slow_capture()) obj->slow_ = *s;
    }
  }
  // sched_switch gained prev_state in 5.18: the 3-argument programs read it from the task.
  obj->switch_3arg_ = tracepoint_arg_count("sched_switch").value_or(4) == 3;
  if (live) {
    spdlog::info(
        "scheduler: reloading its BPF object for labelled maps of {} and {} label sets, slow "
        "off-CPU waits {}",
        obj->entries_[kRunqMap], obj->entries_[kOffcpuMap],
        obj->slow_.on() ? "from " + std::to_string(obj->slow_.threshold_ns) + " ns" : "off");
    obj->load(live->kind_);  // on failure the live object stays as it was
    // The other users' programs are attached to the new object before any of them moves, so
    // that a failure there leaves everything as it was.
    std::vector<std::vector<BpfLink>> links;
    for (SchedHistTracer* other : live->users_) links.push_back(other->link(*obj));
    for (std::size_t i = 0; i < live->users_.size(); ++i) {
      live->users_[i]->finish_move(obj, std::move(links[i]));
      obj->users_.push_back(live->users_[i]);
    }
    live->users_.clear();
    // Users moved onto it count already in the counters the kinds share (drops, misses).
    fresh = obj->users_.empty();
  } else {
    static const std::array<std::string, 4> tracepoints = {"sched_wakeup", "sched_wakeup_new",
                                                           "sched_switch", "sched_process_free"};
    obj->kind_ = start_first_loadable(usable_hooks(prober, tracepoints, preference), "scheduler",
                                      [&](HookKind kind) { obj->load(kind); });
  }
  obj->users_.push_back(&user);
  g_live = obj;
  return obj;
}

void SchedObject::leave(SchedHistTracer& user) {
  std::lock_guard lock(g_mutex);
  std::erase(users_, &user);
}

void SchedObject::load(HookKind kind) {
  kind_ = kind;
  links_.clear();
  std::string btf_path;
  const auto open_opts = skeleton_open_opts(btf_path);
  skel_.reset(scheduler__open_opts(&open_opts));
  if (!skel_) throw BpfError(bpf_error_text("open scheduler", errno));
  scheduler* s = skel_.get();
  const bool btf = !raw();
  for (bpf_program* p :
       {s->progs.sched_wakeup_btf, s->progs.sched_wakeup_new_btf, s->progs.sched_switch_btf,
        s->progs.sched_switch_3arg_btf, s->progs.sched_wakeup_raw, s->progs.sched_wakeup_new_raw,
        s->progs.sched_switch_raw, s->progs.sched_switch_3arg_raw, s->progs.sched_free_raw}) {
    bpf_program__set_autoload(p, false);
  }
  bpf_program__set_autoload(wakeup_program(), true);
  bpf_program__set_autoload(wakeup_new_program(), true);
  bpf_program__set_autoload(switch_program(), true);
  bpf_program__set_autoload(s->progs.sched_free_raw, !btf);
  // tp_btf keeps per-task state in task storage, raw_tp in the pid map: only one is made.
  bpf_map__set_autocreate(s->maps.tstate, btf);
  bpf_map__set_max_entries(s->maps.tstate_by_pid, btf ? 1 : kPidMapEntries);
  bpf_map__set_max_entries(s->maps.runq_hist_labelled, entries_[kRunqMap]);
  bpf_map__set_max_entries(s->maps.offcpu_hist_labelled, entries_[kOffcpuMap]);
  SlowCapture::configure(s, slow_, /*origins=*/0, /*keeps_stacks=*/true);
  make_host_safe(s->obj, "scheduler");
  if (int err = scheduler__load(s)) throw BpfError(bpf_error_text("load scheduler", err));
  if (!btf) links_.push_back(attach_program(s->progs.sched_free_raw));
  links_.push_back(attach_program(switch_program()));
}

SchedObject::~SchedObject() = default;

bpf_program* SchedObject::switch_program() const {
  if (switch_3arg_)
    return raw() ? skel_->progs.sched_switch_3arg_raw : skel_->progs.sched_switch_3arg_btf;
  return raw() ? skel_->progs.sched_switch_raw : skel_->progs.sched_switch_btf;
}
bpf_program* SchedObject::wakeup_program() const {
  return raw() ? skel_->progs.sched_wakeup_raw : skel_->progs.sched_wakeup_btf;
}
bpf_program* SchedObject::wakeup_new_program() const {
  return raw() ? skel_->progs.sched_wakeup_new_raw : skel_->progs.sched_wakeup_new_btf;
}

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

SchedHistTracer::SchedHistTracer(MetricScope& scope, SchedHistKind kind, SchedLabelOptions labels)
    : kind_(std::move(kind)),
      labels_(labels),
      metric_(scope.declare(with_labels(kind_.spec, labels_))),
      hist_(scope, metric_, SCHED_SLOTS),
      drops_(scope, kind_.drop_reasons),
      cgroups_(labels_.cgroup) {}

SchedHistTracer::~SchedHistTracer() {
  if (!obj_) return;
  skel()->bss->sched_cfg.*kind_.on = 0;
  obj_->leave(*this);
}

std::optional<std::uint32_t> SchedHistTracer::label_sets() const {
  if (!labels_.labelled()) return std::nullopt;
  return labels_.cgroup.map_entries;
}

std::optional<SlowOptions> SchedHistTracer::slow_capture() const {
  if (!kind_.slow_capture) return std::nullopt;
  return labels_.slow;
}

void SchedHistTracer::rebase_next() {
  hist_.rebase_next();
  drops_.rebase_next();
}

void SchedHistTracer::forget_counts() {
  hist_.forget();
  drops_.forget();
}

void SchedHistTracer::start(HookProber& prober, HookPreference preference) {
  bool fresh = true;
  obj_ = SchedObject::acquire(prober, preference, *this, fresh);
  links_ = link(*obj_);
  switch_on(fresh);
  switched_on();
}

std::vector<BpfLink> SchedHistTracer::link(const SchedObject& obj) const {
  std::vector<BpfLink> links;
  if (kind_.wants_wakeups) {
    for (bpf_program* p : {obj.wakeup_program(), obj.wakeup_new_program()})
      links.push_back(attach_program(p));
  }
  return links;
}

void SchedHistTracer::finish_move(std::shared_ptr<SchedObject> obj,
                                  std::vector<BpfLink> links) noexcept {
  skel()->bss->sched_cfg.*kind_.on = 0;
  try {
    drain();
  } catch (const std::exception& e) {
    spdlog::error("{}: the last drain of the replaced scheduler object failed: {}", kind_.spec.name,
                  e.what());
  }
  links_ = std::move(links);  // the old ones detach
  obj_ = std::move(obj);
  forget_counts();
  try {
    switch_on(/*fresh=*/false);
  } catch (const std::exception& e) {
    spdlog::error("{}: taking the new scheduler object's counts as baseline failed: {}",
                  kind_.spec.name, e.what());
    skel()->bss->sched_cfg.*kind_.on = 1;
  }
  try {
    switched_on();
  } catch (const std::exception& e) {
    spdlog::error("{}: on the new scheduler object: {}", kind_.spec.name, e.what());
  }
}

void SchedHistTracer::switch_on(bool fresh) {
  std::vector<ProgramChoice> progs = {{obj_->switch_program(), true}};
  if (kind_.wants_wakeups) {
    for (bpf_program* p : {obj_->wakeup_program(), obj_->wakeup_new_program()})
      progs.push_back({p, true});
  }
  drops_.bind(bpf_map__fd(skel()->maps.drops), progs);
  // Taken while this kind is still switched off, so no event falls between baseline and on.
  if (!fresh) {
    rebase_next();
    drain();
  }
  sched_config& cfg = skel()->bss->sched_cfg;
  cfg.*kind_.by_cgroup = labels_.cgroup.on;
  cfg.*kind_.by_comm = labels_.comm;
  cfg.*kind_.on = 1;
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
