// The protobuf exposition: delimited io.prometheus.client.MetricFamily messages, every
// histogram both classic and native (schema 0: the kernel's slots are its buckets).
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "ebpf_metricsd/metrics/exposition_format.h"
#include "ebpf_metricsd/metrics/metric_store.h"
#include "metrics.pb.h"

namespace ebpf_metricsd {

namespace {

namespace pb = io::prometheus::client;

class ProtobufWriter final : public MetricVisitor {
 public:
  explicit ProtobufWriter(std::string& out) : out_(out) {}
  ~ProtobufWriter() override { flush(); }

  void family(const MetricSpec& spec) override {
    flush();
    spec_ = &spec;
    family_.set_name(spec.name);
    family_.set_help(spec.help);
    switch (spec.type) {
      case MetricType::Counter:
        family_.set_type(pb::COUNTER);
        break;
      case MetricType::Gauge:
        family_.set_type(pb::GAUGE);
        break;
      case MetricType::Histogram:
        family_.set_type(pb::HISTOGRAM);
        break;
    }
  }

  void counter(const std::vector<std::string>& labels, double value) override {
    metric(labels)->mutable_counter()->set_value(value);
  }

  void gauge(const std::vector<std::string>& labels, double value) override {
    metric(labels)->mutable_gauge()->set_value(value);
  }

  void histogram(const std::vector<std::string>& labels, const Log2HistogramState& state) override {
    const Log2Layout& layout = spec_->buckets;
    auto* h = metric(labels)->mutable_histogram();
    h->set_sample_count(state.count());
    h->set_sample_sum(static_cast<double>(state.sum_raw) / layout.units_per_base);
    layout.classic(state.slots, cumulative_);
    for (std::size_t i = 0; i < cumulative_.size(); ++i) {
      auto* b = h->add_bucket();
      b->set_cumulative_count(cumulative_[i]);
      b->set_upper_bound(layout.upper_bound(i));
      if (const Exemplar* e = classic_exemplar(layout, state, i)) fill(*e, b->mutable_exemplar());
    }
    if (const Exemplar* e = classic_exemplar(layout, state, cumulative_.size())) {
      // +Inf, which the classic buckets leave out, carried as a bucket of its own.
      auto* b = h->add_bucket();
      b->set_cumulative_count(state.count());
      b->set_upper_bound(std::numeric_limits<double>::infinity());
      fill(*e, b->mutable_exemplar());
    }
    for (const auto& [slot, e] : state.exemplars) fill(e, h->add_exemplars());
    h->set_schema(0);
    h->set_zero_threshold(layout.zero_threshold());
    h->set_zero_count(state.slots.empty() ? 0 : state.slots[0]);
    const NativeBuckets native = native_buckets(layout, state.slots);
    for (const auto& span : native.spans) {
      auto* s = h->add_positive_span();
      s->set_offset(span.offset);
      s->set_length(span.length);
    }
    for (const auto d : native.deltas) h->add_positive_delta(d);
  }

 private:
  static void fill(const Exemplar& e, pb::Exemplar* out) {
    for (const auto& [name, value] : e.labels) {
      auto* l = out->add_label();
      l->set_name(name);
      l->set_value(value);
    }
    out->set_value(e.value);
    const double whole = std::floor(e.timestamp);
    out->mutable_timestamp()->set_seconds(static_cast<std::int64_t>(whole));
    out->mutable_timestamp()->set_nanos(static_cast<std::int32_t>((e.timestamp - whole) * 1e9));
  }

  pb::Metric* metric(const std::vector<std::string>& labels) {
    auto* m = family_.add_metric();
    for (std::size_t i = 0; i < labels.size(); ++i) {
      auto* l = m->add_label();
      l->set_name(spec_->labels[i]);
      l->set_value(labels[i]);
    }
    return m;
  }

  void flush() {
    if (!spec_) return;
    const auto size = family_.ByteSizeLong();
    {
      google::protobuf::io::StringOutputStream stream(&out_);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.WriteVarint32(static_cast<std::uint32_t>(size));
      family_.SerializeWithCachedSizes(&coded);
    }
    family_.Clear();
    spec_ = nullptr;
  }

  std::string& out_;
  const MetricSpec* spec_ = nullptr;
  pb::MetricFamily family_;
  std::vector<std::uint64_t> cumulative_;
};

}  // namespace

std::string render_protobuf(const MetricStore& store) {
  std::string out;
  out.reserve(64 * 1024);
  {
    ProtobufWriter writer(out);
    store.visit(writer);
  }
  return out;
}

}  // namespace ebpf_metricsd
