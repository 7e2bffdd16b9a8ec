// oom_kills: processes the OOM killer chose, by the victim's cgroup.
#include <array>

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
#include "oom_kills.h"
#include "oom_kills.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(oom_kills);

CgroupLabelOptions always_labelled(CgroupLabelOptions o) {
  o.on = true;
  return o;
}

class OomKillsTracer final : public Tracer {
 public:
  using Options = CgroupLabelOptions;
  OomKillsTracer(MetricScope& scope, const CgroupLabelOptions& options)
      : scope_(scope),
        labels_(always_labelled(options)),
        kills_(scope, {{scope.declare(labels_.with_labels(
                          {"ebpf_oom_kills_total",
                           "Processes killed by the OOM killer (of the system or of a memory "
                           "cgroup), by the victim's cgroup.",
                           MetricType::Counter,
                           {}}))}}),
        drops_(scope, drop_reasons<OOM_DROP__COUNT>({"map_full"})) {}

  void start(HookProber& prober, HookPreference preference) override {
    // mark_victim(int pid) before 6.9 and the stable releases that took the change: the
    // pid alone does not name the victim's cgroup, so that form is refused.
    const auto args = tracepoint_arg_count("mark_victim");
    if (args && *args != 2) {
      throw BpfError(
          "this kernel's oom:mark_victim passes only a pid; the victim's task comes with Linux "
          "6.9, 6.6.80, 6.1.130, 5.15.179 and 5.10.235");
    }
    static const std::array<std::string, 1> tps = {"mark_victim"};
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tps, preference, [this](oom_kills* s, HookKind) {
          bpf_map__set_max_entries(s->maps.kills, labels_.options().map_entries);
          return std::vector<HookTwin>{{s->progs.mark_victim_btf, s->progs.mark_victim_raw}};
        });
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    labels_.begin_pass();
    kills_.drain_hash(
        skel_->maps.kills, sizeof(oom_key),
        [&](const void* key) {
          const auto& k = *static_cast<const oom_key*>(key);
          CgroupLabel l = labels_.label(k.cgroup);
          // Removed before it was named (a runtime removes an OOM-killed container's
          // cgroup at once): the kill counts under the parent, for a container its pod.
          if (l.cgroup == "unknown" && k.parent) {
            const CgroupLabel parent = labels_.label(k.parent);
            if (parent.cgroup != "unknown") l = {parent.cgroup, parent.pod, ""};
          }
          return MetricStore::LabelValues{l.cgroup, l.pod, l.container};
        },
        labels_.retire([](const void* key) { return static_cast<const oom_key*>(key)->cgroup; }));
    drops_.drain();
  }

 private:
  MetricScope& scope_;
  CgroupLabels labels_;
  SeriesDrain kills_;
  DropAccounting drops_;
  Object skel_;
};

}  // namespace

TracerDescriptor oom_kills_descriptor() {
  return declare_tracer<OomKillsTracer>("oom_kills", "OOM kills, by the victim's cgroup",
                                        &CgroupLabelOptions::read, {.owner = EventOwner::Always});
}

}  // namespace ebpf_metricsd
