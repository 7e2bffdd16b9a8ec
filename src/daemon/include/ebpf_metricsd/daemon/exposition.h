#pragma once
// What the daemon serves over HTTP: /metrics (the text or the protobuf format, as the
// scraper asks), a landing page at / and /-/healthy, as routes for the web server.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/core/tracer_set.h"
#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/metrics/exposition_format.h"

namespace ebpf_metricsd {

// The format an Accept header asks for, of those it lists with the highest q above 0:
// protobuf (the delimited MetricFamily type), else OpenMetrics (version 1.0.0 or 0.0.1, or
// none given), else the text format 0.0.4 (also without an Accept header, and for text/plain,
// text/* and */*).
ExpositionFormat negotiate_format(std::string_view accept);

std::string html_escape(const std::string& text);

// The page at /: the version and every tracer with its state, hook and error.
std::string landing_page(const std::vector<TracerStatus>& tracers);

// The body of /metrics in a format; the daemon's renders its MetricStore.
using MetricsRenderer = std::function<std::string(ExpositionFormat)>;

// /metrics from `metrics` in the format the Accept header asks for (gzip when asked, counted
// against web.max_requests), / from `landing_html`, /-/healthy 200 while `healthy` says so
// (503 otherwise; 200 without one).
std::vector<Route> exporter_routes(MetricsRenderer metrics,
                                   std::function<std::string()> landing_html,
                                   std::function<bool()> healthy = {});

}  // namespace ebpf_metricsd
