#pragma once
// What the daemon serves over HTTP: /metrics in the Prometheus text format, a landing page
// at / and /-/healthy, as routes for the web server.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/tracer_set.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace ebpf_metricsd {

std::string html_escape(const std::string& text);

// The page at /: the version and every tracer with its state, hook and error.
std::string landing_page(const std::vector<TracerStatus>& tracers);

// /metrics from `metrics` (gzip when asked, counted against web.max_requests), / from
// `landing_html`, /-/healthy 200 while `healthy` says so (503 otherwise; 200 without one).
std::vector<Route> exporter_routes(std::shared_ptr<prometheus::Collectable> metrics,
                                   std::function<std::string()> landing_html,
                                   std::function<bool()> healthy = {});

}  // namespace ebpf_metricsd
