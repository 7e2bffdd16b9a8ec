#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ebpf_metricsd/web_config.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace ebpf_metricsd {

// "" when the address is usable ("host:port", ":port", "[v6]:port"), else why not.
std::string validate_listen_address(const std::string& address);
// The socket address to bind: ":port" is every interface, IPv6 and IPv4 where the kernel
// has IPv6. Throws std::invalid_argument.
sockaddr_storage resolve_listen_address(const std::string& address, bool ipv6_available);
std::string html_escape(const std::string& text);

struct WebSettings {
  std::string listen_address = ":9810";
  WebConfig security;  // TLS and basic auth (--web.config.file)
  std::size_t max_requests = 40;
  std::chrono::milliseconds request_timeout{10000};
};

// A small HTTP/1.1 server: /metrics from the collectable in the Prometheus text format
// (gzip when asked), / a landing page rendered by `landing_html`, /-/healthy 200 while
// `healthy` says so (503 otherwise; always 200 without one), 404 elsewhere. With
// basic_auth_users every path asks for credentials (401); scrapes past max_requests get 503
// at once. A client has request_timeout for its TLS handshake and whole request, so a
// stalled client holds a worker at most that long; one response per connection.
class WebServer {
 public:
  WebServer(WebSettings settings, std::shared_ptr<prometheus::Collectable> metrics,
            std::function<std::string()> landing_html, std::function<bool()> healthy = {});
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  int port() const { return port_; }
  // Loads the certificate, key and CA files again (rotated on disk), for the connections
  // from now on. Throws std::runtime_error and keeps the old ones when they do not load.
  void reload_tls();
  const WebSettings& settings() const { return settings_; }

 private:
  struct Shared;
  void accept_loop();
  void worker_loop();
  void serve(int fd);

  WebSettings settings_;
  std::shared_ptr<Shared> shared_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that ends accept_loop
  int port_ = 0;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<int> queue_;  // accepted connections waiting for a worker
  std::set<int> active_;   // connections being served
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ebpf_metricsd
