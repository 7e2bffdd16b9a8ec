// page_cache: page cache accesses, misses (pages added) and pages dirtied.
#include <array>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/map_drain.h"
#include "ebpf_metricsd/tracer.h"

// clang-format off
#include <linux/types.h>
#include "page_cache.h"
#include "page_cache.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

using Skeleton = SkeletonPtr<page_cache, page_cache__destroy>;

class PageCacheTracer final : public Tracer {
 public:
  explicit PageCacheTracer(MetricStore& store)
      : store_(store),
        accesses_(store.declare({"ebpf_page_cache_accesses_total",
                                 "Page cache pages looked up by reads and file mmap faults.",
                                 MetricType::Counter,
                                 {}})),
        misses_(store.declare({"ebpf_page_cache_misses_total",
                               "Pages added to the page cache because a lookup missed "
                               "(including readahead).",
                               MetricType::Counter,
                               {}})),
        dirtied_(store.declare({"ebpf_page_cache_dirtied_total",
                                "Page cache pages marked dirty.",
                                MetricType::Counter,
                                {}})),
        drops_(store, "page_cache", {}) {}

  void start(HookProber& prober, HookPreference preference) override {
    static const std::array<std::string, 2> tps = {"mm_filemap_add_to_page_cache",
                                                   "writeback_dirty_folio"};
    static const std::array<std::string, 3> access_tps = {
        "mm_filemap_get_pages", "mm_filemap_map_pages", "mm_filemap_fault"};
    const HookKind kind = require_hook(prober, tps, preference);
    // Accesses: folio_mark_accessed() where fentry attaches (exact, as cachestat), else the
    // read and fault tracepoints (an estimate, see README).
    const bool fentry = preference == HookPreference::Auto &&
                        prober.can_attach(HookKind::Fentry, "folio_mark_accessed");
    if (!fentry)
      require_hook(prober, access_tps,
                   kind == HookKind::TpBtf ? HookPreference::TpBtf : HookPreference::RawTp);
    Skeleton skel(page_cache__open());
    if (!skel) throw BpfError(bpf_error_text("open page_cache", errno));
    auto& p = skel->progs;
    const bool btf = kind == HookKind::TpBtf;
    const std::vector<ProgramChoice> programs = {
        {p.mark_accessed_fentry, fentry},   {p.get_pages_btf, btf && !fentry},
        {p.map_pages_btf, btf && !fentry},  {p.fault_btf, btf && !fentry},
        {p.add_to_page_cache_btf, btf},     {p.dirty_folio_btf, btf},
        {p.get_pages_raw, !btf && !fentry}, {p.map_pages_raw, !btf && !fentry},
        {p.fault_raw, !btf && !fentry},     {p.add_to_page_cache_raw, !btf},
        {p.dirty_folio_raw, !btf},
    };
    links_ = load_and_attach(
        programs, [&] { return page_cache__load(skel.get()); }, "page_cache");
    drops_.bind(-1, programs);
    hook_ = fentry ? "fentry+" + std::string(hook_name(kind)) : std::string(hook_name(kind));
    skel_ = std::move(skel);
  }

  std::string hook() const override { return hook_; }

  void drain() override {
    static_assert(sizeof(page_cache_totals) == 3 * 8);
    totals_.drain_array(bpf_map__fd(skel_->maps.totals), 1,
                        [&](const void*, const std::uint64_t* d) {
                          store_.add(accesses_, {}, d[0]);
                          store_.add(misses_, {}, d[1]);
                          store_.add(dirtied_, {}, d[2]);
                        });
    drops_.drain();
  }

 private:
  MetricStore& store_;
  MetricStore::MetricId accesses_, misses_, dirtied_;
  PerCpuDeltas totals_{3};
  DropAccounting drops_;
  Skeleton skel_;
  std::vector<BpfLink> links_;
  std::string hook_;
};

}  // namespace

TracerDescriptor page_cache_descriptor() {
  return descriptor_without_options<PageCacheTracer>(
      "page_cache", "Page cache accesses, misses and dirtied pages");
}

}  // namespace ebpf_metricsd
