#pragma once
// The wire formats of /metrics, written from a MetricStore in one pass under its read lock:
// the Prometheus text format (0.0.4); OpenMetrics text (1.0.0), which adds the exemplars of
// histogram buckets; and the protobuf format (delimited io.prometheus.client.MetricFamily
// messages) in which every histogram is also a native histogram of schema 0, with exemplars
// on classic buckets and on the native histogram.

#include <string>
#include <string_view>

namespace ebpf_metricsd {

class MetricStore;

enum class ExpositionFormat { Text, OpenMetrics, Protobuf };

inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";
inline constexpr std::string_view kOpenMetricsContentType =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
inline constexpr std::string_view kProtobufContentType =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
    "encoding=delimited";

std::string render_text(const MetricStore& store);
std::string render_openmetrics(const MetricStore& store);
std::string render_protobuf(const MetricStore& store);
std::string render(const MetricStore& store, ExpositionFormat format);
std::string_view content_type(ExpositionFormat format);

// The shortest decimal that parses back to the same double ("+Inf", "-Inf", "NaN" aside).
std::string format_double(double value);

}  // namespace ebpf_metricsd
