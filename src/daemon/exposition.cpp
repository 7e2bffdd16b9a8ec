#include "ebpf_metricsd/daemon/exposition.h"

#include <algorithm>

#include "ebpf_metricsd/http/request_grammar.h"

namespace ebpf_metricsd {

ExpositionFormat negotiate_format(std::string_view accept) {
  double protobuf_q = 0;
  double openmetrics_q = 0;
  double text_q = 0;
  for (const HeaderListElement& e : parse_header_list(accept)) {
    if (e.token == "application/vnd.google.protobuf") {
      if (e.param("proto") == "io.prometheus.client.MetricFamily" &&
          ascii_lower(e.param("encoding")) == "delimited") {
        protobuf_q = std::max(protobuf_q, e.q);
      }
    } else if (e.token == "application/openmetrics-text") {
      const std::string_view version = e.param("version");
      if (version.empty() || version == "1.0.0" || version == "0.0.1") {
        openmetrics_q = std::max(openmetrics_q, e.q);
      }
    } else if (e.token == "text/plain" || e.token == "text/*" || e.token == "*/*") {
      text_q = std::max(text_q, e.q);
    }
  }
  if (protobuf_q > 0 && protobuf_q >= openmetrics_q && protobuf_q >= text_q) {
    return ExpositionFormat::Protobuf;
  }
  if (openmetrics_q > 0 && openmetrics_q >= text_q) return ExpositionFormat::OpenMetrics;
  return ExpositionFormat::Text;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string landing_page(const std::vector<TracerStatus>& states) {
  std::string rows;
  for (const auto& s : states) {
    const std::string state = !s.enabled ? "disabled" : s.up ? "up" : "failed";
    rows.append("<tr><td>").append(html_escape(s.name)).append("</td><td>");
    rows.append(html_escape(s.summary)).append("</td><td class=\"").append(state).append("\">");
    rows.append(state).append("</td><td>").append(html_escape(s.hook)).append("</td><td>");
    rows.append(html_escape(s.error)).append("</td></tr>\n");
  }
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ebpf-metricsd</title>"
         "<style>body{font-family:sans-serif;margin:2em}td,th{padding:.3em .8em;"
         "text-align:left;border-bottom:1px solid #ddd}.up{color:#080}.failed{color:#b00}"
         ".disabled{color:#888}</style></head><body>\n<h1>ebpf-metricsd</h1>\n"
         "<p>Version " EBPF_METRICSD_VERSION
         ". Metrics: <a href=\"/metrics\">/metrics</a>. Profiles (the profile tracer): "
         "<a href=\"/profile\">flame graph</a>, "
         "<a href=\"/debug/pprof/profile?seconds=30\">pprof</a></p>\n"
         "<table><tr><th>tracer</th><th>measures</th><th>state</th><th>hook</th>"
         "<th>error</th></tr>\n" +
         rows + "</table>\n</body></html>\n";
}

std::vector<Route> exporter_routes(MetricsRenderer metrics,
                                   std::function<std::string()> landing_html,
                                   std::function<bool()> healthy) {
  std::vector<Route> routes;
  routes.push_back({"/metrics",
                    [metrics = std::move(metrics)](const HttpRequest& request) {
                      const auto format = negotiate_format(request.header("Accept").value_or(""));
                      HttpResponse r;
                      r.content_type = content_type(format);
                      r.body = metrics(format);
                      r.headers.emplace_back("Vary", "Accept");
                      r.compressible = true;
                      return r;
                    },
                    /*limited=*/true});
  routes.push_back({"/", [landing = std::move(landing_html)](const HttpRequest&) {
                      HttpResponse r;
                      r.content_type = "text/html; charset=utf-8";
                      r.body = landing ? landing() : "";
                      return r;
                    }});
  routes.push_back({"/-/healthy", [healthy = std::move(healthy)](const HttpRequest&) {
                      HttpResponse r;
                      if (!healthy || healthy()) {
                        r.body = "OK\n";
                      } else {
                        r.status = 503;
                        r.body = "unhealthy: the tracers' maps have not been drained lately\n";
                      }
                      return r;
                    }});
  return routes;
}

}  // namespace ebpf_metricsd
