// The Prometheus text format (version 0.0.4) and OpenMetrics text (1.0.0), written straight
// from the store. OpenMetrics differs where Prometheus' parser needs it to: a counter family
// is named without its "_total" (which its samples keep), HELP escapes quotes, bucket lines
// carry exemplars, and "# EOF" ends the exposition.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "ebpf_metricsd/metrics/exposition_format.h"
#include "ebpf_metricsd/metrics/metric_store.h"

namespace ebpf_metricsd {

std::string format_double(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, res.ptr);
}

namespace {

void append_double(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += format_double(value);
    return;
  }
  char buf[32];
  out.append(buf, std::to_chars(buf, buf + sizeof buf, value).ptr);
}

void append_uint(std::string& out, std::uint64_t value) {
  char buf[24];
  out.append(buf, std::to_chars(buf, buf + sizeof buf, value).ptr);
}

// Label values escape \, " and newline; HELP text escapes \ and newline.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

constexpr std::string_view kTotal = "_total";

bool ends_with_total(std::string_view name) {
  return name.size() > kTotal.size() && name.substr(name.size() - kTotal.size()) == kTotal;
}

class TextWriter final : public MetricVisitor {
 public:
  TextWriter(std::string& out, bool openmetrics) : out_(out), om_(openmetrics) {}

  void family(const MetricSpec& spec) override {
    spec_ = &spec;
    static constexpr const char* kTypes[] = {"counter", "gauge", "histogram"};
    std::string_view name = spec.name;
    sample_name_ = spec.name;
    if (om_ && spec.type == MetricType::Counter) {
      if (ends_with_total(name)) {
        name.remove_suffix(kTotal.size());
      } else {
        sample_name_ += kTotal;
      }
    }
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    append_escaped(out_, spec.help, om_);
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += kTypes[static_cast<int>(spec.type)];
    out_ += '\n';
    if (spec.type == MetricType::Histogram) {
      bounds_.clear();
      for (std::size_t i = 0; i < spec.buckets.finite_buckets(); ++i) {
        bounds_.push_back(format_double(spec.buckets.upper_bound(i)));
      }
    }
  }

  void counter(const std::vector<std::string>& labels, double value) override {
    sample_start("", labels);
    label_end();
    append_double(out_, value);
    out_ += '\n';
  }

  void gauge(const std::vector<std::string>& labels, double value) override {
    counter(labels, value);
  }

  void histogram(const std::vector<std::string>& labels, const Log2HistogramState& state) override {
    const Log2Layout& layout = spec_->buckets;
    layout.classic(state.slots, cumulative_);
    const std::uint64_t count = state.count();
    for (std::size_t i = 0; i <= cumulative_.size(); ++i) {
      sample_start("_bucket", labels);
      out_ += labels.empty() ? "le=\"" : ",le=\"";
      out_ += i < cumulative_.size() ? std::string_view(bounds_[i]) : "+Inf";
      out_ += "\"} ";
      append_uint(out_, i < cumulative_.size() ? cumulative_[i] : count);
      if (om_) {
        if (const Exemplar* e = classic_exemplar(layout, state, i)) append_exemplar(*e);
      }
      out_ += '\n';
    }
    sample_start("_sum", labels);
    label_end();
    append_double(out_, static_cast<double>(state.sum_raw) / layout.units_per_base);
    out_ += '\n';
    sample_start("_count", labels);
    label_end();
    append_uint(out_, count);
    out_ += '\n';
  }

 private:
  // " # {l1="v1",...} value timestamp"
  void append_exemplar(const Exemplar& e) {
    out_ += " # {";
    for (std::size_t i = 0; i < e.labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += e.labels[i].first;
      out_ += "=\"";
      append_escaped(out_, e.labels[i].second, true);
      out_ += '"';
    }
    out_ += "} ";
    append_double(out_, e.value);
    out_ += ' ';
    append_timestamp(e.timestamp);
  }
  // Seconds with milliseconds, as Prometheus keeps them.
  void append_timestamp(double seconds) {
    char buf[40];
    const int n = std::snprintf(buf, sizeof buf, "%.3f", seconds);
    out_.append(buf, static_cast<std::size_t>(n));
  }

  // name{l1="v1",l2="v2"  (the brace is closed by the caller, so "le" can follow)
  void sample_start(std::string_view suffix, const std::vector<std::string>& labels) {
    out_ += suffix.empty() ? sample_name_ : spec_->name;
    out_ += suffix;
    open_ = !labels.empty() || suffix == "_bucket";
    if (open_) out_ += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += spec_->labels[i];
      out_ += "=\"";
      append_escaped(out_, labels[i], true);
      out_ += '"';
    }
  }
  void label_end() { out_ += open_ ? "} " : " "; }

  std::string& out_;
  const bool om_;
  const MetricSpec* spec_ = nullptr;
  std::string sample_name_;  // of counter and gauge samples
  bool open_ = false;
  std::vector<std::string> bounds_;
  std::vector<std::uint64_t> cumulative_;
};

}  // namespace

std::string render_text(const MetricStore& store) {
  std::string out;
  out.reserve(64 * 1024);
  TextWriter writer(out, false);
  store.visit(writer);
  return out;
}

std::string render_openmetrics(const MetricStore& store) {
  std::string out;
  out.reserve(64 * 1024);
  TextWriter writer(out, true);
  store.visit(writer);
  out += "# EOF\n";
  return out;
}

std::string render(const MetricStore& store, ExpositionFormat format) {
  switch (format) {
    case ExpositionFormat::Protobuf:
      return render_protobuf(store);
    case ExpositionFormat::OpenMetrics:
      return render_openmetrics(store);
    case ExpositionFormat::Text:
      break;
  }
  return render_text(store);
}

std::string_view content_type(ExpositionFormat format) {
  switch (format) {
    case ExpositionFormat::Protobuf:
      return kProtobufContentType;
    case ExpositionFormat::OpenMetrics:
      return kOpenMetricsContentType;
    case ExpositionFormat::Text:
      break;
  }
  return kTextContentType;
}

}  // namespace ebpf_metricsd
