#pragma once
// How the web server serves: what the config's `web` section and --web.config.file set.

#include <chrono>
#include <cstddef>
#include <string>

#include "ebpf_metricsd/http/web_config.h"

namespace ebpf_metricsd {

// "" when the address is usable ("host:port", ":port", "[v6]:port"), else why not.
std::string validate_listen_address(const std::string& address);

struct WebSettings {
  std::string listen_address = ":9810";
  WebConfig security;  // TLS and basic auth (--web.config.file)
  // Requests of limited routes (/metrics) being answered or waiting at once; one more gets
  // 503.
  std::size_t max_requests = 40;
  // Open connections in all, and from one client address; more are closed at once.
  std::size_t max_connections = 4096;
  std::size_t max_connections_per_address = 32;
  // From connect, the TLS handshake and the request head must arrive within this; a
  // response must be sent within it again.
  std::chrono::milliseconds request_timeout{10000};
  // After a response, a kept-alive connection's next request head must arrive within this.
  std::chrono::milliseconds idle_timeout{120000};

  // Equal settings serve alike (the web config file compared by its text too), so that a
  // reload restarts the server only when they differ.
  bool operator==(const WebSettings&) const = default;
};

}  // namespace ebpf_metricsd
