// kmalloc: kmalloc/kfree calls, bytes and sizes; optionally kmem_cache_alloc/free by cache.
#include <array>
#include <cstring>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/drop_accounting.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/skeleton.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_scope.h"
#include "ebpf_metricsd/tracers/registry.h"

// clang-format off
#include <linux/types.h>
#include "kmalloc.h"
#include "kmalloc.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {

struct KmallocOptions {
  bool caches = false;
  std::uint32_t max_caches = KMALLOC_MAX_CACHES;
  // 8 B .. 4 MiB: the kmalloc size classes, up to the largest allocation it makes.
  Log2Layout buckets = Log2Layout::bytes(3, 22);
};

using Object = EBPF_METRICSD_SKELETON(kmalloc);

class KmallocTracer final : public Tracer {
 public:
  using Options = KmallocOptions;
  KmallocTracer(MetricScope& scope, KmallocOptions options)
      : scope_(scope),
        options_(options),
        kmalloc_calls_(scope.declare(
            {"ebpf_kmalloc_calls_total", "kmalloc() calls.", MetricType::Counter, {}})),
        kfree_calls_(
            scope.declare({"ebpf_kfree_calls_total", "kfree() calls.", MetricType::Counter, {}})),
        bytes_(scope.declare({"ebpf_kmalloc_bytes_total",
                              "Bytes asked of kmalloc (requested) and handed out by it "
                              "(allocated, rounded up to the slab size).",
                              MetricType::Counter,
                              {"kind"}})),
        sizes_(scope, {{scope.declare({"ebpf_kmalloc_size_bytes",
                                       "Requested kmalloc() sizes.",
                                       MetricType::Histogram,
                                       {},
                                       options.buckets}),
                        KMALLOC_SLOTS}}),
        drops_(scope, drop_reasons<KMALLOC_DROP__COUNT>({"map_full"})) {
    if (options_.caches) {
      caches_.emplace(scope, std::vector<ValueColumn>{
                                 {scope.declare({"ebpf_kmem_cache_alloc_calls_total",
                                                 "kmem_cache_alloc() calls, by slab cache.",
                                                 MetricType::Counter,
                                                 {"cache"}})},
                                 {scope.declare({"ebpf_kmem_cache_free_calls_total",
                                                 "kmem_cache_free() calls, by slab cache.",
                                                 MetricType::Counter,
                                                 {"cache"}})}});
    }
  }

  void start(HookProber& prober, HookPreference preference) override {
    std::vector<std::string> tps = {"kmalloc", "kfree"};
    if (options_.caches) {
      require_cache_arguments();
      tps.push_back("kmem_cache_alloc");
      tps.push_back("kmem_cache_free");
    }
    const bool caches = options_.caches;
    const std::uint32_t max_caches = options_.max_caches;
    skel_ = Object::load_probed(
        scope_.tracer(), drops_, prober, tps, preference,
        [&prober, caches, max_caches](kmalloc* s, HookKind k) {
          // Before 6.1, kmalloc_node() fired a tracepoint of its own. (Its BTF answers for
          // tp_btf without libbpf warning about a missing name.)
          const bool node = k == HookKind::TpBtf ? tracepoint_arg_count("kmalloc_node").has_value()
                                                 : prober.can_attach(k, "kmalloc_node");
          bpf_map__set_max_entries(s->maps.caches, max_caches);
          auto& p = s->progs;
          return std::vector<HookTwin>{
              {p.kmalloc_btf, p.kmalloc_raw},
              {p.kmalloc_node_btf, p.kmalloc_node_raw, node},
              {p.kfree_btf, p.kfree_raw},
              {p.cache_alloc_btf, p.cache_alloc_raw, caches},
              {p.cache_free_btf, p.cache_free_raw, caches},
          };
        });
  }

  // The per-cache programs read the slab cache from the tracepoints' third argument, which
  // kmem_cache_free has had since 5.12 and kmem_cache_alloc since 6.1 (before, its third
  // argument is the requested size).
  static void require_cache_arguments() {
    for (const char* tp : {"kmem_cache_alloc", "kmem_cache_free"}) {
      const auto types = tracepoint_arg_types(tp);
      if (!types) throw BpfError(std::string("caches: no BTF for tracepoint ") + tp);
      if (types->size() < 3 || (*types)[2] != "struct kmem_cache *") {
        throw BpfError(std::string("caches: true needs the slab cache as the third argument of ") +
                       tp + ", which this kernel does not pass");
      }
    }
  }

  std::string hook() const override { return skel_.hook(); }

  void drain() override {
    static_assert(sizeof(kmalloc_totals) == 4 * 8);
    totals_.drain_array(skel_->maps.totals, 1,
                        [](const void*) { return MetricStore::LabelValues{}; });
    sizes_.drain_array(skel_->maps.sizes, 1,
                       [](const void*) { return MetricStore::LabelValues{}; });
    if (options_.caches) {
      caches_->drain_hash(skel_->maps.caches, sizeof(kmalloc_cache_key), [](const void* key) {
        return MetricStore::LabelValues{
            fixed_name(static_cast<const kmalloc_cache_key*>(key)->name)};
      });
    }
    drops_.drain();
  }

 private:
  MetricScope& scope_;
  KmallocOptions options_;
  MetricScope::Metric kmalloc_calls_, kfree_calls_, bytes_;
  // {kmalloc calls, kfree calls, bytes requested, bytes allocated}
  SeriesDrain totals_{
      scope_,
      {{kmalloc_calls_}, {kfree_calls_}, {bytes_, 0, {"requested"}}, {bytes_, 0, {"allocated"}}}};
  std::optional<SeriesDrain> caches_;  // {allocations, frees} by cache, with `caches: true`
  SeriesDrain sizes_;
  DropAccounting drops_;
  Object skel_;
};

}  // namespace

TracerDescriptor kmalloc_descriptor() {
  return declare_tracer<KmallocTracer>("kmalloc", "kmalloc/kfree calls and sizes",
                                       [](YamlMapReader& options) {
                                         KmallocOptions o;
                                         o.caches = options.get_bool("caches", false);
                                         o.max_caches = static_cast<std::uint32_t>(options.get_int(
                                             "max_caches", KMALLOC_MAX_CACHES, 1, 65536));
                                         o.buckets = read_buckets(options, o.buckets);
                                         return o;
                                       },
                                       {.owner = EventOwner::None});
}

}  // namespace ebpf_metricsd
