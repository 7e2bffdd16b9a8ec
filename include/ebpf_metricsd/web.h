#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ebpf_metricsd/web_config.h"

namespace prometheus {
class Exposer;
class Collectable;
}  // namespace prometheus

namespace ebpf_metricsd {

// Whether the HTTP server library was built with IPv6 (Debian 12's civetweb is not).
bool web_server_has_ipv6();
// "" when the address is usable ("host:port", ":port", "[v6]:port"), else why not.
std::string validate_listen_address(const std::string& address);
// The same address in civetweb's listening_ports syntax.
std::string civetweb_listen_spec(const std::string& address);
std::string html_escape(const std::string& text);

struct WebSettings {
  std::string listen_address = ":9810";
  WebConfig security;  // TLS and basic auth (--web.config.file)
  std::size_t max_requests = 40;
  std::chrono::milliseconds request_timeout{10000};
};

// /metrics from the collectable (prometheus-cpp Exposer over civetweb), / a landing page
// rendered by `landing_html`, anything else 404. With basic_auth_users every path asks for
// credentials (401); scrapes past max_requests get 503 at once. One server at a time.
class WebServer {
 public:
  WebServer(WebSettings settings, std::shared_ptr<prometheus::Collectable> metrics,
            std::function<std::string()> landing_html);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  std::vector<int> ports() const;
  const WebSettings& settings() const { return settings_; }

 private:
  WebSettings settings_;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace ebpf_metricsd
