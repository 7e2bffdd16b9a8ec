// The metric store's series limit and metric ownership (what a tracer restart keeps).
#include <catch2/catch.hpp>

#include "../metrics_lookup.h"
#include "ebpf_metricsd/metric_store.h"

using namespace ebpf_metricsd;

namespace {

std::size_t series_of(const MetricStore& store, const std::string& name) {
  for (const auto& fam : test::collect(store)) {
    if (fam.name == name) return fam.metric.size();
  }
  return 0;
}

const MetricSpec kCounter{"test_events_total", "Events.", MetricType::Counter, {"comm"}};

}  // namespace

TEST_CASE("past max_series new label sets are refused and counted; existing ones go on") {
  MetricStore store;
  store.set_series_limit(3);
  const auto id = store.declare(kCounter);
  for (int i = 0; i < 10; ++i) store.add(id, {"c" + std::to_string(i)}, 1);
  store.add(id, {"c0"}, 5);  // an existing series still counts
  CHECK(series_of(store, "test_events_total") == 3);
  CHECK(test::counter_value(store, "test_events_total", {{"comm", "c0"}}) == 6);
  CHECK(test::counter_value(store, "ebpf_metricsd_series_limited_total",
                            {{"metric", "test_events_total"}}) == 7);
  // The limit counter itself is never limited.
  CHECK(series_of(store, "ebpf_metricsd_series_limited_total") == 1);
  store.set_series_limit(0);
  store.add(id, {"c9"}, 1);
  CHECK(series_of(store, "test_events_total") == 4);
}

TEST_CASE("label values that are not UTF-8 are stored with U+FFFD") {
  MetricStore store;
  const auto id = store.declare(kCounter);
  // "ééééééé" and the first byte of an eighth: a comm cut by the kernel at 15 bytes.
  store.add(id, {std::string("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3", 15)},
            1);
  CHECK(test::counter_value(store, "test_events_total", {{"comm", "ééééééé\xEF\xBF\xBD"}}) == 1);
}

TEST_CASE("a released owner's metrics keep their series for a restarted owner") {
  MetricStore store;
  const MetricStore::MetricId id = store.declare(kCounter, "tracer_a");
  store.add(id, {"x"}, 42);
  store.release_owner("tracer_a");
  CHECK(store.declare(kCounter, "tracer_a") == id);  // same spec: adopted, counting on
  store.drop_unowned();
  store.add(id, {"x"}, 1);
  CHECK(test::counter_value(store, "test_events_total", {{"comm", "x"}}) == 43);

  // Declared with other labels while owned: a programming error.
  MetricSpec other = kCounter;
  other.labels = {"cgroup"};
  CHECK_THROWS_AS(store.declare(other, "tracer_a"), std::invalid_argument);
  // Released, the new spec replaces the old one and its series.
  store.release_owner("tracer_a");
  store.declare(other, "tracer_a");
  CHECK(series_of(store, "test_events_total") == 0);
}

TEST_CASE("metrics nobody declares again are dropped; series of one tracer can be erased") {
  MetricStore store;
  const auto own = store.declare({"test_b_total", "B.", MetricType::Counter, {}}, "tracer_b");
  const auto drops =
      store.declare({"test_drops_total", "Drops.", MetricType::Counter, {"tracer"}}, "tracer_b");
  store.declare({"test_drops_total", "Drops.", MetricType::Counter, {"tracer"}});  // core too
  store.add(own, {}, 1);
  store.add(drops, {"tracer_b"}, 2);
  store.add(drops, {"tracer_c"}, 3);
  store.release_owner("tracer_b");
  store.erase_series_with("tracer", "tracer_b");
  store.drop_unowned();
  CHECK(series_of(store, "test_b_total") == 0);
  CHECK(series_of(store, "test_drops_total") == 1);
  CHECK(test::counter_value(store, "test_drops_total", {{"tracer", "tracer_c"}}) == 3);
}
