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

// The format an Accept header asks for, of those it lists with the highest q above 0:
// protobuf (the delimited MetricFamily type), else OpenMetrics (version 1.0.0 or 0.0.1, or
// none given), else the text format 0.0.4 (also without an Accept header, and for text/plain,
// text/* and */*).
ExpositionFormat negotiate_format(std::string_view accept);

std::string render_text(const MetricStore& store);
std::string render_openmetrics(const MetricStore& store);
std::string render_protobuf(const MetricStore& store);
std::string render(const MetricStore& store, ExpositionFormat format);
std::string_view content_type(ExpositionFormat format);

// The shortest decimal that parses back to the same double ("+Inf", "-Inf", "NaN" aside).
std::string format_double(double value);

}  // namespace ebpf_metricsd
