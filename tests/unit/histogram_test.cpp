#include <linux/types.h>
#include <prometheus/text_serializer.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "common/log2_slot.h"
#include "ebpf_metricsd/log2_histogram.h"
#include "ebpf_metricsd/metric_store.h"

using namespace ebpf_metricsd;

namespace {

// Reference: smallest k with v <= 2^k (0 for v <= 1).
__u64 reference_slot(__u64 v) {
  __u64 k = 0;
  while (k < 64 && (__uint128_t(1) << k) < v) ++k;
  return k;
}

std::string serialize(const MetricStore& store) {
  prometheus::TextSerializer s;
  return s.Serialize(store.Collect());
}

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("log2 slot is the exact ceil(log2(v)) on power-of-two edges") {
  CHECK(emd_log2_slot(0, 63) == 0);
  CHECK(emd_log2_slot(1, 63) == 0);
  CHECK(emd_log2_slot(2, 63) == 1);
  CHECK(emd_log2_slot(3, 63) == 2);
  CHECK(emd_log2_slot(4, 63) == 2);
  CHECK(emd_log2_slot(5, 63) == 3);
  for (__u64 k = 1; k < 63; ++k) {
    const __u64 p = __u64(1) << k;
    INFO("k=" << k);
    CHECK(emd_log2_slot(p, 63) == k);          // 2^k is still "le 2^k"
    CHECK(emd_log2_slot(p + 1, 63) == k + 1);  // one more is not
    CHECK(emd_log2_slot(p - 1, 63) == reference_slot(p - 1));
  }
}

TEST_CASE("log2 slot matches the reference on random values and clamps") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    const __u64 v = rng() >> (rng() % 63 + 1);
    REQUIRE(emd_log2_slot(v, 63) == reference_slot(v));
    REQUIRE(emd_log2_slot(v, 39) == std::min<__u64>(reference_slot(v), 39));
  }
}

TEST_CASE("log2 layout: bounds are exact powers of two in base units") {
  const Log2Layout ns{1e9, 5, 36};
  REQUIRE(ns.finite_buckets() == 32);
  CHECK(ns.upper_bound(0) == 32e-9);
  CHECK(ns.upper_bound(5) == 1024e-9);
  CHECK(ns.upper_bound(31) == std::ldexp(1.0, 36) / 1e9);
  const Log2Layout bytes{1, 3, 10};
  CHECK(bytes.upper_bound(0) == 8);
  CHECK(bytes.upper_bound(7) == 1024);
}

TEST_CASE("log2 layout folds slots below, inside and above the range") {
  const Log2Layout l{1, 2, 4};  // buckets le=4, le=8, le=16, overflow
  std::vector<std::uint64_t> slots(8, 0);
  slots[0] = 1;  // v <= 1    -> le=4
  slots[2] = 2;  // v in (2,4] -> le=4
  slots[3] = 3;  // -> le=8
  slots[4] = 4;  // -> le=16
  slots[5] = 5;  // -> +Inf only
  slots[7] = 6;  // -> +Inf only
  std::vector<std::uint64_t> buckets(l.finite_buckets() + 1, 0);
  l.fold(slots, buckets);
  CHECK(buckets == std::vector<std::uint64_t>{3, 3, 4, 11});
  Log2HistogramState h{buckets, 0};
  CHECK(h.count() == 21);
  CHECK(h.cumulative() == std::vector<std::uint64_t>{3, 6, 10});
}

TEST_CASE("metric store exports cumulative buckets, +Inf == count, exact sum") {
  MetricStore store;
  MetricSpec spec{"test_latency_seconds",
                  "Test latency.",
                  MetricType::Histogram,
                  {"op"},
                  Log2Layout{1e9, 5, 8}};
  const auto id = store.declare(spec);
  std::vector<std::uint64_t> slots(10, 0);
  slots[3] = 2;  // <= 8ns     -> le 32ns
  slots[6] = 5;  // (32,64]ns  -> le 64ns
  slots[8] = 1;  // (128,256]  -> le 256ns
  slots[9] = 7;  // > 256ns    -> +Inf
  store.add_slots(id, {"read"}, slots, 3'000'000'000ULL);
  store.add_slots(id, {"read"}, slots, 1'500'000'000ULL);  // deltas add up

  const auto fams = store.Collect();
  REQUIRE(fams.size() == 1);
  REQUIRE(fams[0].metric.size() == 1);
  const auto& h = fams[0].metric[0].histogram;
  CHECK(h.sample_count == 30);
  CHECK(h.sample_sum == 4.5);
  REQUIRE(h.bucket.size() == 4);
  CHECK(h.bucket[0].cumulative_count == 4);
  CHECK(h.bucket[1].cumulative_count == 14);
  CHECK(h.bucket[2].cumulative_count == 14);
  CHECK(h.bucket[3].cumulative_count == 16);
  CHECK(h.bucket[3].upper_bound == 256e-9);

  const std::string text = serialize(store);
  CHECK_THAT(text,
             Catch::Matchers::Contains("test_latency_seconds_bucket{op=\"read\",le=\"+Inf\"} 30"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_latency_seconds_count{op=\"read\"} 30"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_latency_seconds_sum{op=\"read\"} 4.5"));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "test_latency_seconds_bucket{op=\"read\",le=\"2.56e-07\"} 16"));
}

TEST_CASE("counters and gauges; empty metrics are not exported") {
  MetricStore store;
  const auto c = store.declare({"test_events_total", "Events.", MetricType::Counter, {"kind"}});
  const auto g = store.declare({"test_up", "Up.", MetricType::Gauge, {}});
  store.declare({"test_unused_total", "Never set.", MetricType::Counter, {}});
  store.add(c, {"a"}, 5);
  store.add(c, {"a"}, 7);
  store.set(g, {}, 1);
  const std::string text = serialize(store);
  CHECK_THAT(text, Catch::Matchers::Contains("test_events_total{kind=\"a\"} 12"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_up 1"));
  CHECK_THAT(text, !Catch::Matchers::Contains("test_unused_total"));
  CHECK(store.series_count() == 2);
  CHECK_THROWS_AS(store.add(c, {"a", "b"}, 1), std::invalid_argument);
  CHECK_THROWS_AS(store.declare({"bad name", "x", MetricType::Counter, {}}), std::invalid_argument);
  CHECK_THROWS_AS(
      store.declare({"test_events_total", "Other help.", MetricType::Counter, {"kind"}}),
      std::invalid_argument);
  CHECK(store.declare({"test_events_total", "Events.", MetricType::Counter, {"kind"}}) == c);
}

TEST_CASE("label values are made valid UTF-8") {
  CHECK(sanitize_utf8("nginx") == "nginx");
  CHECK(sanitize_utf8("caf\xC3\xA9") == "caf\xC3\xA9");
  CHECK(sanitize_utf8("cut\xE2\x82") == "cut\xEF\xBF\xBD\xEF\xBF\xBD");  // € cut in half
  CHECK(sanitize_utf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");        // overlong '/'
  CHECK(sanitize_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  MetricStore store;
  const auto c = store.declare({"test_comm_total", "By comm.", MetricType::Counter, {"comm"}});
  store.add(c, {"bad\xFF"}, 1);
  store.add(c, {"bad\xFF"}, 1);
  CHECK(store.series_count() == 1);
  CHECK_THAT(serialize(store),
             Catch::Matchers::Contains("test_comm_total{comm=\"bad\xEF\xBF\xBD\"} 2"));
}

TEST_CASE("exposition is accepted by promtool check metrics") {
  MetricStore store;
  const auto h = store.declare({"ebpf_test_latency_seconds",
                                "Test latency.",
                                MetricType::Histogram,
                                {"syscall"},
                                Log2Layout{1e9, 5, 36}});
  const auto c =
      store.declare({"ebpf_test_events_total", "Test events.", MetricType::Counter, {"reason"}});
  const auto g = store.declare({"ebpf_test_up", "Test up.", MetricType::Gauge, {"hook"}});
  std::vector<std::uint64_t> slots(40, 0);
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = i * 3;
  store.add_slots(h, {"read"}, slots, 123456789);
  store.add_slots(h, {"write"}, slots, 1);
  store.add(c, {"map_full"}, 3);
  store.set(g, {"tp_btf"}, 1);
  char path[] = "/tmp/emd-promtool-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << serialize(store);
  CHECK(run(std::string("promtool check metrics < ") + path) == 0);
  std::remove(path);
}
