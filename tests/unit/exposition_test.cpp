// The two formats of /metrics: text as Prometheus reads it, protobuf parsed back with the
// generated messages, and the choice between them by Accept header.
#include <google/protobuf/io/coded_stream.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "ebpf_metricsd/daemon/exposition.h"
#include "ebpf_metricsd/metrics/exposition_format.h"
#include "ebpf_metricsd/metrics/metric_store.h"
#include "metrics.pb.h"

using namespace ebpf_metricsd;
namespace pb = io::prometheus::client;

namespace {

std::vector<pb::MetricFamily> parse_delimited(const std::string& body) {
  std::vector<pb::MetricFamily> out;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const std::uint8_t*>(body.data()),
                                            static_cast<int>(body.size()));
  while (!in.ExpectAtEnd()) {
    std::uint32_t size = 0;
    REQUIRE(in.ReadVarint32(&size));
    const auto limit = in.PushLimit(static_cast<int>(size));
    pb::MetricFamily fam;
    REQUIRE(fam.ParseFromCodedStream(&in));
    REQUIRE(in.ConsumedEntireMessage());
    in.PopLimit(limit);
    out.push_back(std::move(fam));
  }
  return out;
}

struct Fixture {
  MetricStore store;
  MetricStore::MetricId hist = store.declare({"test_latency_seconds",
                                              "Latency, \"quoted\" \\ and\nnewline.",
                                              MetricType::Histogram,
                                              {"op"},
                                              Log2Layout::seconds(-20, -18)});
  MetricStore::MetricId sizes = store.declare(
      {"test_size_bytes", "Sizes.", MetricType::Histogram, {}, Log2Layout::bytes(3, 5)});
  MetricStore::MetricId events =
      store.declare({"test_events_total", "Events.", MetricType::Counter, {"kind"}});
  MetricStore::MetricId up = store.declare({"test_up", "Up.", MetricType::Gauge, {}});
  Fixture() {
    std::vector<std::uint64_t> slots(64, 0);
    slots[0] = 1;   // 0 ns
    slots[5] = 2;   // 2^-25 s
    slots[10] = 3;  // 2^-20 s
    slots[11] = 4;  // 2^-19 s
    slots[14] = 5;  // 2^-16 s: above the classic range
    store.add_slots(hist, {"a\"b\\c\nd"}, slots, 123456789);
    std::vector<std::uint64_t> bytes(64, 0);
    bytes[0] = 1;  // 0 bytes
    bytes[1] = 2;  // 1 byte
    bytes[7] = 3;  // (32, 64]
    store.add_slots(sizes, {}, bytes, 2 + 3 * 64);
    store.add(events, {"x"}, 7);
    store.set(up, {}, 1);
  }
};

}  // namespace

TEST_CASE("text format: escaping, exact bounds, +Inf, sum and count") {
  Fixture f;
  const std::string text = render_text(f.store);
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "# HELP test_latency_seconds Latency, \"quoted\" \\\\ and\\nnewline.\n"
                       "# TYPE test_latency_seconds histogram\n"));
  const std::string labels = "op=\"a\\\"b\\\\c\\nd\"";
  CHECK_THAT(text, Catch::Matchers::Contains("test_latency_seconds_bucket{" + labels +
                                             ",le=\"9.5367431640625e-07\"} 6\n"
                                             "test_latency_seconds_bucket{" +
                                             labels +
                                             ",le=\"1.9073486328125e-06\"} 10\n"
                                             "test_latency_seconds_bucket{" +
                                             labels +
                                             ",le=\"3.814697265625e-06\"} 10\n"
                                             "test_latency_seconds_bucket{" +
                                             labels +
                                             ",le=\"+Inf\"} 15\n"
                                             "test_latency_seconds_sum{" +
                                             labels +
                                             "} 0.123456789\n"
                                             "test_latency_seconds_count{" +
                                             labels + "} 15\n"));
  CHECK_THAT(text, Catch::Matchers::Contains("test_size_bytes_bucket{le=\"8\"} 3\n"
                                             "test_size_bytes_bucket{le=\"16\"} 3\n"
                                             "test_size_bytes_bucket{le=\"32\"} 3\n"
                                             "test_size_bytes_bucket{le=\"+Inf\"} 6\n"
                                             "test_size_bytes_sum 194\n"
                                             "test_size_bytes_count 6\n"));
  CHECK_THAT(text, Catch::Matchers::Contains("# TYPE test_events_total counter\n"
                                             "test_events_total{kind=\"x\"} 7\n"));
  CHECK_THAT(text, Catch::Matchers::Contains("# TYPE test_up gauge\ntest_up 1\n"));
}

TEST_CASE("protobuf format: classic and native buckets of the same slots") {
  Fixture f;
  const auto fams = parse_delimited(render_protobuf(f.store));
  REQUIRE(fams.size() == 4);  // families without series (series_limited_total) left out
  const pb::MetricFamily* lat = nullptr;
  const pb::MetricFamily* sizes = nullptr;
  for (const auto& fam : fams) {
    if (fam.name() == "test_latency_seconds") lat = &fam;
    if (fam.name() == "test_size_bytes") sizes = &fam;
  }
  REQUIRE(lat);
  CHECK(lat->help() == "Latency, \"quoted\" \\ and\nnewline.");
  CHECK(lat->type() == pb::HISTOGRAM);
  REQUIRE(lat->metric_size() == 1);
  const auto& m = lat->metric(0);
  REQUIRE(m.label_size() == 1);
  CHECK(m.label(0).name() == "op");
  CHECK(m.label(0).value() == "a\"b\\c\nd");
  const auto& h = m.histogram();
  CHECK(h.sample_count() == 15);
  CHECK(h.sample_sum() == 0.123456789);
  REQUIRE(h.bucket_size() == 3);
  CHECK(h.bucket(0).upper_bound() == std::ldexp(1.0, -20));
  CHECK(h.bucket(0).cumulative_count() == 6);
  CHECK(h.bucket(2).cumulative_count() == 10);
  CHECK(h.schema() == 0);
  CHECK(h.zero_threshold() == std::ldexp(1.0, -30));
  CHECK(h.zero_count() == 1);
  // Buckets at exponents -25 (2), -20 (3), -19 (4), -16 (5): two spans, the two empty
  // buckets -18 and -17 inside the second.
  REQUIRE(h.positive_span_size() == 2);
  CHECK(h.positive_span(0).offset() == -25);
  CHECK(h.positive_span(0).length() == 1);
  CHECK(h.positive_span(1).offset() == 4);
  CHECK(h.positive_span(1).length() == 5);
  CHECK(std::vector<std::int64_t>(h.positive_delta().begin(), h.positive_delta().end()) ==
        std::vector<std::int64_t>{2, 1, 1, -4, 0, 5});
  // Native counts add up to the sample count.
  std::int64_t running = 0;
  std::uint64_t total = h.zero_count();
  for (const auto d : h.positive_delta()) total += static_cast<std::uint64_t>(running += d);
  CHECK(total == h.sample_count());

  REQUIRE(sizes);
  const auto& b = sizes->metric(0).histogram();
  CHECK(b.zero_threshold() == 0.5);
  CHECK(b.zero_count() == 1);               // the 0-byte request
  CHECK(b.positive_span(0).offset() == 0);  // 1 byte: bucket 0 = (0.5, 1]
  CHECK(b.sample_sum() == 194);
}

TEST_CASE("protobuf format: counters and gauges") {
  Fixture f;
  int seen = 0;
  for (const auto& fam : parse_delimited(render_protobuf(f.store))) {
    if (fam.name() == "test_events_total") {
      CHECK(fam.type() == pb::COUNTER);
      REQUIRE(fam.metric_size() == 1);
      CHECK(fam.metric(0).label(0).name() == "kind");
      CHECK(fam.metric(0).label(0).value() == "x");
      CHECK(fam.metric(0).counter().value() == 7);
      ++seen;
    } else if (fam.name() == "test_up") {
      CHECK(fam.type() == pb::GAUGE);
      REQUIRE(fam.metric_size() == 1);
      CHECK(fam.metric(0).label_size() == 0);
      CHECK(fam.metric(0).gauge().value() == 1);
      ++seen;
    }
  }
  CHECK(seen == 2);
}

TEST_CASE("Accept picks the format") {
  using F = ExpositionFormat;
  CHECK(negotiate_format("") == F::Text);
  CHECK(negotiate_format("*/*") == F::Text);
  CHECK(negotiate_format("text/plain;version=0.0.4") == F::Text);
  // What Prometheus 2.42 sends with native histograms enabled, and without:
  CHECK(negotiate_format("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                         "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
                         "application/openmetrics-text;version=0.0.1;q=0.75,"
                         "text/plain;version=0.0.4;q=0.5,*/*;q=0.1") == F::Protobuf);
  CHECK(negotiate_format("application/openmetrics-text;version=1.0.0,application/"
                         "openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,"
                         "*/*;q=0.1") == F::OpenMetrics);
  CHECK(negotiate_format("application/openmetrics-text") == F::OpenMetrics);
  CHECK(negotiate_format("application/openmetrics-text; version=0.0.1") == F::OpenMetrics);
  // A version this daemon does not write, or a lower q than text's, is text.
  CHECK(negotiate_format("application/openmetrics-text;version=2.0.0") == F::Text);
  CHECK(negotiate_format("application/openmetrics-text;q=0.4,text/plain;q=0.5") == F::Text);
  CHECK(negotiate_format("application/openmetrics-text;q=0") == F::Text);
  CHECK(negotiate_format("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                         "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2") ==
        F::Protobuf);
  // A tie goes to protobuf.
  CHECK(negotiate_format("text/plain,application/vnd.google.protobuf;"
                         "proto=io.prometheus.client.MetricFamily;encoding=delimited") ==
        F::Protobuf);
  CHECK(
      negotiate_format("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
                       "encoding=delimited") == F::Protobuf);
  // Other protobuf messages or encodings are not ours to send.
  CHECK(negotiate_format(
            "application/vnd.google.protobuf;proto=other.Message;encoding=delimited") == F::Text);
  CHECK(negotiate_format("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                         "encoding=text") == F::Text);
  // Preference by q; q=0 refuses.
  CHECK(negotiate_format("text/plain;q=0.9,application/vnd.google.protobuf;"
                         "proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5") ==
        F::Text);
  CHECK(negotiate_format("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                         "encoding=delimited;q=0") == F::Text);
  CHECK(negotiate_format("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                         "encoding=delimited;q=bogus") == F::Text);
  CHECK(negotiate_format(",,;;=,q=") == F::Text);
}

namespace {

Exemplar exemplar(const std::string& stack, double value, double timestamp) {
  return {{{"stack_id", stack}, {"pid", "42"}, {"comm", "w\"x"}}, value, timestamp};
}

// Slots 5 and 10 fall in the first classic bucket (the later one shows), 11 in the second,
// 14 above the classic range (+Inf); the third bucket has none.
void add_exemplars(Fixture& f) {
  const std::vector<std::string> op = {"a\"b\\c\nd"};
  f.store.set_exemplar(f.hist, op, 5, exemplar("00000000000000a5", 2.98e-8, 100.5));
  f.store.set_exemplar(f.hist, op, 10, exemplar("00000000000000aa", 9.0e-7, 200.25));
  f.store.set_exemplar(f.hist, op, 11, exemplar("00000000000000ab", 1.5e-6, 150));
  f.store.set_exemplar(f.hist, op, 14, exemplar("00000000000000ae", 1.4e-5, 50));
}

}  // namespace

TEST_CASE("OpenMetrics text: counters without _total in their family, exemplars, # EOF") {
  Fixture f;
  add_exemplars(f);
  const std::string om = render_openmetrics(f.store);
  const std::string labels = "op=\"a\\\"b\\\\c\\nd\"";
  const std::string ex = "stack_id=\"00000000000000";
  CHECK_THAT(om, Catch::Matchers::Contains(
                     "# HELP test_latency_seconds Latency, \\\"quoted\\\" \\\\ and\\nnewline.\n"
                     "# TYPE test_latency_seconds histogram\n"
                     "test_latency_seconds_bucket{" +
                     labels + ",le=\"9.5367431640625e-07\"} 6 # {" + ex +
                     "aa\",pid=\"42\",comm=\"w\\\"x\"} 9e-07 200.250\n"
                     "test_latency_seconds_bucket{" +
                     labels + ",le=\"1.9073486328125e-06\"} 10 # {" + ex +
                     "ab\",pid=\"42\",comm=\"w\\\"x\"} 1.5e-06 150.000\n"
                     "test_latency_seconds_bucket{" +
                     labels +
                     ",le=\"3.814697265625e-06\"} 10\n"
                     "test_latency_seconds_bucket{" +
                     labels + ",le=\"+Inf\"} 15 # {" + ex +
                     "ae\",pid=\"42\",comm=\"w\\\"x\"} 1.4e-05 50.000\n"));
  CHECK_THAT(om, Catch::Matchers::Contains("# TYPE test_events counter\n"
                                           "test_events_total{kind=\"x\"} 7\n"));
  CHECK_THAT(om, Catch::Matchers::Contains("# TYPE test_up gauge\ntest_up 1\n"));
  CHECK(om.size() > 6);
  CHECK(om.substr(om.size() - 6) == "# EOF\n");
  // The text format 0.0.4 stays as it was: no exemplars, no EOF, counters by their name.
  const std::string text = render_text(f.store);
  CHECK_THAT(text, !Catch::Matchers::Contains("stack_id"));
  CHECK_THAT(text, !Catch::Matchers::Contains("# EOF"));
  CHECK_THAT(text, Catch::Matchers::Contains("# TYPE test_events_total counter\n"));
}

TEST_CASE("exemplars: only on a series that exists, at most 128 characters of labels") {
  MetricStore store;
  const auto h =
      store.declare({"x_seconds", "X.", MetricType::Histogram, {}, Log2Layout::seconds(-20, -18)});
  // An exemplar never makes a series: its event is counted first.
  store.set_exemplar(h, {}, 10, {{{"stack_id", "0000000000000001"}}, 1e-6, 1});
  CHECK(render_openmetrics(store) == "# EOF\n");
  std::vector<std::uint64_t> slots(64, 0);
  slots[10] = 1;
  store.add_slots(h, {}, slots, 1000);
  store.set_exemplar(
      h, {}, 10,
      {{{"stack_id", "0123456789abcdef"}, {"comm", std::string(100, 'c')}, {"pid", "1"}}, 1e-6, 1});
  const std::string om = render_openmetrics(store);
  CHECK_THAT(om, Catch::Matchers::Contains("# {stack_id=\"0123456789abcdef\",comm=\"" +
                                           std::string(100, 'c') + "\"} 1e-06 1.000\n"));
}

TEST_CASE(
    "protobuf format: exemplars on classic buckets, +Inf as a bucket, and on the native "
    "histogram") {
  Fixture f;
  add_exemplars(f);
  const auto families = parse_delimited(render_protobuf(f.store));
  const pb::MetricFamily* latency = nullptr;
  for (const auto& fam : families) {
    if (fam.name() == "test_latency_seconds") latency = &fam;
  }
  REQUIRE(latency);
  const pb::Histogram& h = latency->metric(0).histogram();
  REQUIRE(h.bucket_size() == 4);  // three finite and +Inf, which carries an exemplar
  CHECK(h.bucket(0).exemplar().label(0).value() == "00000000000000aa");
  CHECK(h.bucket(0).exemplar().value() == 9.0e-7);
  CHECK(h.bucket(0).exemplar().timestamp().seconds() == 200);
  CHECK(h.bucket(0).exemplar().timestamp().nanos() == 250000000);
  CHECK(h.bucket(1).exemplar().label(0).value() == "00000000000000ab");
  CHECK_FALSE(h.bucket(2).has_exemplar());
  CHECK(std::isinf(h.bucket(3).upper_bound()));
  CHECK(h.bucket(3).cumulative_count() == 15);
  CHECK(h.bucket(3).exemplar().label(0).value() == "00000000000000ae");
  // Every slot's latest, with timestamps, on the native histogram.
  REQUIRE(h.exemplars_size() == 4);
  for (const auto& e : h.exemplars()) CHECK(e.has_timestamp());
}
