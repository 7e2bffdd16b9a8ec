#include <linux/types.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "../metrics_lookup.h"
#include "common/log2_slot.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/metrics/exposition_format.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/metrics/metric_store.h"
#include "metrics.pb.h"

using namespace ebpf_metricsd;
using namespace ebpf_metricsd::test;

namespace {

// Reference: smallest k with v <= 2^k (0 for v <= 1).
__u64 reference_slot(__u64 v) {
  __u64 k = 0;
  while (k < 64 && (__uint128_t(1) << k) < v) ++k;
  return k;
}

std::string serialize(const MetricStore& store) { return render_text(store); }

// floor(2^e * 1e9) in 128-bit integers: the largest ns count that is at most 2^e seconds.
__u64 ns_at_most_pow2_seconds(int e) {
  const __uint128_t ns_per_s = 1000000000;
  if (e >= 0) return static_cast<__u64>(ns_per_s << e);
  return static_cast<__u64>(ns_per_s >> -e);
}

// Reference seconds slot: the smallest e in -29..33 with ns <= 2^e s, as slot e + 30;
// 0 ns is slot 0.
__u64 reference_seconds_slot(__u64 ns) {
  if (ns == 0) return 0;
  for (int e = -29; e <= 33; ++e) {
    if (ns <= ns_at_most_pow2_seconds(e)) return static_cast<__u64>(e + 30);
  }
  return 63;
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

TEST_CASE("seconds slots: the threshold table is floor(2^e * 1e9) ns") {
  for (__u64 s = 0; s < 64; ++s) {
    INFO("s=" << s);
    CHECK(emd_ns_threshold(s) == ns_at_most_pow2_seconds(static_cast<int>(s) - 30));
  }
}

TEST_CASE("seconds slots are exact powers of two of seconds on every edge") {
  CHECK(emd_seconds_slot(0) == 0);
  CHECK(emd_seconds_slot(1) == 1);            // 1 ns <= 2^-29 s (1.86 ns)
  CHECK(emd_seconds_slot(2) == 2);            // 2 ns > 1.86 ns
  CHECK(emd_seconds_slot(1000000000) == 30);  // 1 s: le="1"
  CHECK(emd_seconds_slot(1000000001) == 31);
  CHECK(emd_seconds_slot(500000000) == 29);  // 0.5 s: le="0.5"
  CHECK(emd_seconds_slot(500000001) == 30);
  for (int e = -29; e <= 32; ++e) {
    const __u64 edge = ns_at_most_pow2_seconds(e);
    INFO("e=" << e << " edge=" << edge);
    if (edge > 0) CHECK(emd_seconds_slot(edge) == static_cast<__u64>(e + 30));
    CHECK(emd_seconds_slot(edge + 1) == static_cast<__u64>(e + 31));
  }
  CHECK(emd_seconds_slot(~0ULL >> 1) == 63);  // beyond 2^33 s: the last slot
  CHECK(emd_seconds_slot(~0ULL) == 63);
  CHECK(emd_seconds_slot((1ULL << 63) + 1) == 63);
}

TEST_CASE("seconds slots match the reference on random values") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300000; ++i) {
    const __u64 v = rng() >> (rng() % 63 + 1);
    REQUIRE(emd_seconds_slot(v) == reference_seconds_slot(v));
  }
}

TEST_CASE("byte slots: 0 alone, then powers of two of bytes") {
  CHECK(emd_bytes_slot(0) == 0);
  CHECK(emd_bytes_slot(1) == 1);  // le=1
  CHECK(emd_bytes_slot(2) == 2);  // le=2
  CHECK(emd_bytes_slot(3) == 3);  // le=4
  CHECK(emd_bytes_slot(4) == 3);
  CHECK(emd_bytes_slot(4096) == 13);  // 2^12 -> exponent 12 -> slot 13
  CHECK(emd_bytes_slot(4097) == 14);
  CHECK(emd_bytes_slot(~0ULL) == 63);  // beyond 2^62: the last slot
  CHECK(emd_bytes_slot((1ULL << 63) + 1) == 63);
  const auto bytes = Log2Layout::bytes(0, 20);
  for (__u64 k = 1; k < 62; ++k) {
    const __u64 v = __u64(1) << k;
    CHECK(bytes.exponent(emd_bytes_slot(v)) == static_cast<int>(k));
    CHECK(bytes.exponent(emd_bytes_slot(v + 1)) == static_cast<int>(k) + 1);
  }
}

TEST_CASE("log2 layout: classic bounds are exact powers of two, printed shortest") {
  const auto s = Log2Layout::seconds(-20, 4);
  REQUIRE(s.finite_buckets() == 25);
  CHECK(s.upper_bound(0) == std::ldexp(1.0, -20));
  CHECK(s.upper_bound(20) == 1);
  CHECK(s.upper_bound(24) == 16);
  CHECK(format_double(s.upper_bound(0)) == "9.5367431640625e-07");
  CHECK(format_double(s.upper_bound(3)) == "7.62939453125e-06");
  CHECK(format_double(s.upper_bound(19)) == "0.5");
  CHECK(format_double(std::ldexp(1.0, -30)) == "9.313225746154785e-10");
  for (int e = -29; e <= 33; ++e) {  // every bound parses back to the same double
    const std::string text = format_double(std::ldexp(1.0, e));
    CHECK(std::strtod(text.c_str(), nullptr) == std::ldexp(1.0, e));
  }
  const auto b = Log2Layout::bytes(3, 10);
  CHECK(b.upper_bound(0) == 8);
  CHECK(b.upper_bound(7) == 1024);
  CHECK(b.zero_threshold() == 0.5);
  CHECK(s.zero_threshold() == std::ldexp(1.0, -30));
}

TEST_CASE("log2 layout folds slots below, inside and above the classic range") {
  const auto l = Log2Layout::bytes(2, 4);  // le=4, le=8, le=16; slot k is exponent k-1
  std::vector<std::uint64_t> slots(8, 0);
  slots[0] = 1;  // 0        -> le=4
  slots[2] = 2;  // (1,2]    -> le=4
  slots[3] = 3;  // (2,4]    -> le=4
  slots[4] = 4;  // (4,8]    -> le=8
  slots[5] = 5;  // (8,16]   -> le=16
  slots[6] = 6;  // (16,32]  -> +Inf only
  std::vector<std::uint64_t> cumulative;
  l.classic(slots, cumulative);
  CHECK(cumulative == std::vector<std::uint64_t>{6, 10, 15});
  Log2HistogramState h{slots, 0, {}};
  CHECK(h.count() == 21);
}

TEST_CASE("native buckets: spans and deltas of schema 0, small gaps kept in a span") {
  const auto l = Log2Layout::seconds(-20, 4);
  std::vector<std::uint64_t> slots(64, 0);
  CHECK(native_buckets(l, slots).spans.empty());
  slots[0] = 9;   // zero bucket: not a positive bucket
  slots[10] = 3;  // exponent -20
  slots[11] = 5;  // -19
  slots[13] = 2;  // -17 (one empty bucket before it)
  slots[20] = 4;  // -10 (six empty: a new span)
  const auto n = native_buckets(l, slots);
  REQUIRE(n.spans.size() == 2);
  CHECK(n.spans[0].offset == -20);
  CHECK(n.spans[0].length == 4);
  CHECK(n.spans[1].offset == 6);
  CHECK(n.spans[1].length == 1);
  CHECK(n.deltas == std::vector<std::int64_t>{3, 2, -5, 2, 2});
}

TEST_CASE("buckets option: durations and sizes round outwards to powers of two") {
  auto parse = [](const std::string& yaml, const Log2Layout& defaults) {
    const YAML::Node node = parse_yaml(yaml, "t.yaml");
    YamlMapReader r(node, "t.yaml", "tracers.x");
    const auto out = read_buckets(r, defaults);
    r.finish();
    return out;
  };
  const auto s = Log2Layout::seconds(-20, 4);
  CHECK(parse("{}", s) == s);
  const auto a = parse("buckets: {min: 1us, max: 10s}", s);
  CHECK(a.min_exp == -20);  // 2^-20 s = 954 ns <= 1 us
  CHECK(a.max_exp == 4);    // 16 s >= 10 s
  const auto b = parse("buckets: {min: 250ms, max: 1m}", s);
  CHECK(b.min_exp == -2);
  CHECK(b.max_exp == 6);
  CHECK(parse("buckets: {min: 0.5s, max: 1s}", s).min_exp == -1);  // exact powers stay
  CHECK(parse("buckets: {min: 0.5s, max: 1s}", s).max_exp == 0);
  const auto k = parse("buckets: {min: 16, max: 4KiB}", Log2Layout::bytes(3, 22));
  CHECK(k.min_exp == 4);
  CHECK(k.max_exp == 12);
  CHECK_THROWS_WITH(
      parse("buckets: {min: 1s, max: 1ms}", s),
      Catch::Matchers::Contains("tracers.x.buckets") && Catch::Matchers::Contains("above max"));
  CHECK_THROWS_WITH(parse("buckets: {min: 1 fortnight}", s),
                    Catch::Matchers::Contains("tracers.x.buckets.min") &&
                        Catch::Matchers::Contains("not a duration"));
  CHECK_THROWS_WITH(parse("buckets: {min: 0s}", s), Catch::Matchers::Contains("not a duration"));
  CHECK_THROWS_WITH(parse("buckets: {min: -1s}", s), Catch::Matchers::Contains("not a duration"));
  CHECK_THROWS_WITH(parse("buckets: {max: 1000y}", s), Catch::Matchers::Contains("buckets.max"));
  CHECK_THROWS_WITH(parse("buckets: {max: 100000000h}", s), Catch::Matchers::Contains("outside"));
  CHECK_THROWS_WITH(parse("buckets: {min: 0.1ns}", s), Catch::Matchers::Contains("outside"));
  CHECK(parse("buckets: {min: 1ns}", s).min_exp == -29);  // the finest there is
  CHECK(parse("buckets: {min: 1}", Log2Layout::bytes(3, 22)).min_exp == 0);
  CHECK_THROWS_WITH(parse("buckets: {min: 1us, mx: 1s}", s),
                    Catch::Matchers::Contains("buckets.mx"));
  CHECK_THROWS_WITH(parse("buckets: {min: 1ms}", Log2Layout::bytes(3, 22)),
                    Catch::Matchers::Contains("not a size"));
  CHECK_THROWS_WITH(parse("buckets: [1, 2]", s), Catch::Matchers::Contains("buckets"));
}

TEST_CASE("metric store exports cumulative buckets, +Inf == count, exact sum") {
  MetricStore store;
  MetricSpec spec{"test_latency_seconds",
                  "Test latency.",
                  MetricType::Histogram,
                  {"op"},
                  Log2Layout::seconds(-25, -22)};  // le 2^-25 s (29.8 ns) .. 2^-22 s (238 ns)
  const auto id = store.declare(spec);
  std::vector<std::uint64_t> slots(10, 0);
  slots[3] = 2;  // 2^-27 s      -> le 2^-25
  slots[6] = 5;  // 2^-24 s      -> le 2^-24
  slots[8] = 1;  // 2^-22 s      -> le 2^-22
  slots[9] = 7;  // 2^-21 s      -> +Inf
  store.add_slots(id, {"read"}, slots, 3'000'000'000ULL);
  store.add_slots(id, {"read"}, slots, 1'500'000'000ULL);  // deltas add up

  const auto fams = test::collect(store);
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
  CHECK(h.bucket[3].upper_bound == std::ldexp(1.0, -22));

  const std::string text = serialize(store);
  CHECK_THAT(text,
             Catch::Matchers::Contains("test_latency_seconds_bucket{op=\"read\",le=\"+Inf\"} 30"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_latency_seconds_count{op=\"read\"} 30"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_latency_seconds_sum{op=\"read\"} 4.5"));
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "test_latency_seconds_bucket{op=\"read\",le=\"2.384185791015625e-07\"} 16"));
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
                                Log2Layout::seconds(-25, 6)});
  const auto c =
      store.declare({"ebpf_test_events_total", "Test events.", MetricType::Counter, {"reason"}});
  const auto g = store.declare({"ebpf_test_up", "Test up.", MetricType::Gauge, {"hook"}});
  std::vector<std::uint64_t> slots(64, 0);
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
