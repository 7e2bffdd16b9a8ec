// The metric store's series limit and metric ownership (what a tracer restart keeps).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "../metrics_lookup.h"
#include "ebpf_metricsd/metrics/metric_store.h"

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

TEST_CASE("updates are not starved by scrapes rendering back to back") {
  // Four readers hold the store's read lock 2 ms at a time, overlapping, as scrapes do under
  // load; a reader-preferring lock would let the writer in only when all four happen to be
  // out at once. The writer's 200 updates must each get in after the readers of the moment.
  MetricStore store;
  const auto id = store.declare(kCounter);
  store.add(id, {"x"}, 1);
  struct Slow final : MetricVisitor {
    void family(const MetricSpec&) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    void counter(const std::vector<std::string>&, double) override {}
    void gauge(const std::vector<std::string>&, double) override {}
    void histogram(const std::vector<std::string>&, const Log2HistogramState&) override {}
  };
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(500 * i));
      Slow slow;
      while (!stop) store.visit(slow);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(10);
  int done = 0;
  std::thread writer([&] {
    for (; done < 200 && std::chrono::steady_clock::now() < deadline; ++done) {
      store.add(id, {"x"}, 1);
    }
  });
  writer.join();
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  for (auto& r : readers) r.join();
  INFO("200 updates took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                           << " ms");
  CHECK(done == 200);
  CHECK(took < std::chrono::seconds(5));
  CHECK(test::counter_value(store, "test_events_total", {{"comm", "x"}}) == 201);
}
