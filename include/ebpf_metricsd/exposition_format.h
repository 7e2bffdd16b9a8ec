#pragma once
// The two wire formats of /metrics, written from a MetricStore in one pass under its read
// lock: the Prometheus text format (0.0.4), and the protobuf format (delimited
// io.prometheus.client.MetricFamily messages) in which every histogram is also a native
// histogram of schema 0.

#include <string>
#include <string_view>

namespace ebpf_metricsd {

class MetricStore;

enum class ExpositionFormat { Text, Protobuf };

inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";
inline constexpr std::string_view kProtobufContentType =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
    "encoding=delimited";

// The format an Accept header asks for: protobuf when it lists the delimited MetricFamily
// type with a q above 0 and at least that of every text type it lists; text otherwise
// (also without an Accept header).
ExpositionFormat negotiate_format(std::string_view accept);

std::string render_text(const MetricStore& store);
std::string render_protobuf(const MetricStore& store);
inline std::string render(const MetricStore& store, ExpositionFormat format) {
  return format == ExpositionFormat::Protobuf ? render_protobuf(store) : render_text(store);
}

// The shortest decimal that parses back to the same double ("+Inf", "-Inf", "NaN" aside).
std::string format_double(double value);

}  // namespace ebpf_metricsd
