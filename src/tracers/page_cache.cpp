// page_cache: page cache accesses, misses (pages added) and pages dirtied.
#include <spdlog/spdlog.h>

#include <array>
#include <filesystem>

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
#include "page_cache.h"
#include "page_cache.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Object = EBPF_METRICSD_SKELETON(page_cache);

class PageCacheTracer final : public Tracer {
 public:
  using Options = CgroupLabelOptions;
  PageCacheTracer(MetricScope& scope, const CgroupLabelOptions& cgroup)
      : scope_(scope),
        labels_(cgroup),
        accesses_(scope.declare(
            labels_.with_labels({"ebpf_page_cache_accesses_total",
                                 "Page cache pages looked up by reads and file mmap faults.",
                                 MetricType::Counter,
                                 {}}))),
        misses_(scope.declare(labels_.with_labels(
            {"ebpf_page_cache_misses_total",
             "Pages added to the page cache because a lookup missed (including readahead).",
             MetricType::Counter,
             {}}))),
        dirtied_(scope.declare(labels_.with_labels({"ebpf_page_cache_dirtied_total",
                                                    "Page cache pages marked dirty.",
                                                    MetricType::Counter,
                                                    {}}))),
        drops_(scope, drop_reasons<PAGE_CACHE_DROP__COUNT>({"map_full"})) {}

  // How accesses are counted: fentry (else a kprobe) on the kernel's mark-accessed
  // function (exact, as cachestat), else the read and fault tracepoints (an estimate, see
  // README).
  enum class Access { FolioFentry, PageFentry, FolioKprobe, PageKprobe, Tracepoints };

  void start(HookProber& prober, HookPreference preference) override {
    // Folios came in 5.16 (the tracepoints pass a page before) and writeback_dirty_folio in
    // 5.17; which of each the kernel has, its BTF and the attach probes say.
    const auto added = tracepoint_arg_types("mm_filemap_add_to_page_cache");
    folio_added_ = !added || added->empty() || (*added)[0] != "struct page *";
    dirty_tp_ = prober.can_attach(HookKind::RawTp, "writeback_dirty_folio")
                    ? "writeback_dirty_folio"
                    : "writeback_dirty_page";
    const std::array<std::string, 2> tps = {"mm_filemap_add_to_page_cache", dirty_tp_};
    std::vector<Access> access;
    if (prober.can_attach(HookKind::Fentry, "folio_mark_accessed"))
      access.push_back(Access::FolioFentry);
    if (prober.can_attach(HookKind::Fentry, "mark_page_accessed"))
      access.push_back(Access::PageFentry);
    // Kernels built without kprobes have no kprobe PMU; elsewhere the attach tells.
    if (access.empty() && std::filesystem::exists("/sys/bus/event_source/devices/kprobe/type")) {
      access.push_back(Access::FolioKprobe);
      access.push_back(Access::PageKprobe);
    }
    access.push_back(Access::Tracepoints);

    // Every pair of tracepoint kind and access method the probes allow, best first; the
    // first that loads wins.
    std::string why;
    for (HookKind kind : usable_hooks(prober, tps, preference)) {
      for (Access a : access) {
        if (a == Access::Tracepoints) {
          static const std::array<std::string, 3> access_tps = {
              "mm_filemap_get_pages", "mm_filemap_map_pages", "mm_filemap_fault"};
          const HookPreference only =
              kind == HookKind::TpBtf ? HookPreference::TpBtf : HookPreference::RawTp;
          if (!choose_hook(prober, access_tps, only)) {
            why += (why.empty() ? "" : "; ") + std::string(hook_name(kind)) +
                   ": no fentry and no read tracepoints for accesses";
            continue;
          }
        }
        try {
          start_with(kind, a);
          return;
        } catch (const BpfError& e) {
          why += (why.empty() ? "" : "; ") + std::string(hook_name(kind)) + " with " +
                 access_name(a) + ": " + e.what();
          spdlog::info("tracer {}: {} with {} does not load here ({}), trying the next",
                       scope_.tracer(), hook_name(kind), access_name(a), e.what());
        }
      }
    }
    throw BpfError(why);
  }

  static std::string access_prefix(Access a) {
    switch (a) {
      case Access::FolioFentry:
      case Access::PageFentry:
        return "fentry+";
      case Access::FolioKprobe:
      case Access::PageKprobe:
        return "kprobe+";
      case Access::Tracepoints:
        return "";
    }
    return "";
  }

  static const char* access_name(Access a) {
    switch (a) {
      case Access::FolioFentry:
        return "fentry/folio_mark_accessed";
      case Access::PageFentry:
        return "fentry/mark_page_accessed";
      case Access::FolioKprobe:
        return "kprobe/folio_mark_accessed";
      case Access::PageKprobe:
        return "kprobe/mark_page_accessed";
      case Access::Tracepoints:
        return "access tracepoints";
    }
    return "?";
  }

  void start_with(HookKind kind, Access access) {
    skel_ = Object::load(
        scope_.tracer(), drops_,
        [&](page_cache* s) { return programs_of(choose(s, access), kind); },
        access_prefix(access) + std::string(hook_name(kind)));
  }

  std::vector<HookTwin> choose(page_cache* skel, Access access) const {
    skel->rodata->emd_by_cgroup = labels_.on();
    bpf_map__set_max_entries(skel->maps.totals_by_cgroup, labels_.options().kernel_map_entries());
    auto& p = skel->progs;
    const bool tp_access = access == Access::Tracepoints;
    const bool dirty_folio = dirty_tp_ == "writeback_dirty_folio";
    const auto either = [](bpf_program* prog, bool wanted) { return HookTwin{prog, prog, wanted}; };
    return {
        either(p.mark_accessed_fentry, access == Access::FolioFentry),
        either(p.mark_page_accessed_fentry, access == Access::PageFentry),
        either(p.mark_accessed_kprobe, access == Access::FolioKprobe),
        either(p.mark_page_accessed_kprobe, access == Access::PageKprobe),
        {p.get_pages_btf, p.get_pages_raw, tp_access},
        {p.map_pages_btf, p.map_pages_raw, tp_access},
        {p.fault_btf, p.fault_raw, tp_access},
        {p.add_to_page_cache_btf, p.add_to_page_cache_raw, folio_added_},
        {p.add_page_to_page_cache_btf, p.add_page_to_page_cache_raw, !folio_added_},
        {p.dirty_folio_btf, p.dirty_folio_raw, dirty_folio},
        {p.dirty_page_btf, p.dirty_page_raw, !dirty_folio},
    };
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(page_cache_totals) == 3 * 8);
    if (labels_.on()) {
      labels_.begin_pass();
      const auto id_of = [](const void* key) { return *static_cast<const std::uint64_t*>(key); };
      totals_.drain_hash(
          skel_->maps.totals_by_cgroup, sizeof(std::uint64_t),
          [&](const void* key) {
            MetricStore::LabelValues v;
            labels_.append(v, id_of(key));
            return v;
          },
          labels_.retire(id_of));
    } else {
      totals_.drain_array(skel_->maps.totals, 1,
                          [](const void*) { return MetricStore::LabelValues{}; });
    }
    drops_.drain();
  }

 private:
  MetricScope& scope_;
  CgroupLabels labels_;
  MetricScope::Metric accesses_, misses_, dirtied_;
  SeriesDrain totals_{scope_, {{accesses_}, {misses_}, {dirtied_}}};
  DropAccounting drops_;
  Object skel_;
  bool folio_added_ = true;  // mm_filemap_add_to_page_cache passes a folio (5.16+)
  std::string dirty_tp_;
};

}  // namespace

TracerDescriptor page_cache_descriptor() {
  return declare_tracer<PageCacheTracer>(
      "page_cache", "Page cache accesses, misses and dirtied pages", &CgroupLabelOptions::read);
}

}  // namespace ebpf_metricsd
