#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

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

// /metrics from the collectable (prometheus-cpp Exposer over civetweb), / a landing page
// rendered by `landing_html`, anything else 404.
class WebServer {
 public:
  WebServer(const std::string& listen_address, std::shared_ptr<prometheus::Collectable> metrics,
            std::function<std::string()> landing_html);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  std::vector<int> ports() const;

 private:
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::function<std::string()> landing_html_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace ebpf_metricsd
