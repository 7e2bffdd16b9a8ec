#include "ebpf_metricsd/web.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <civetweb.h>
#include <prometheus/exposer.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace ebpf_metricsd {

namespace {

struct SplitAddress {
  std::string host;  // without brackets; "" = all interfaces
  bool ipv6 = false;
  std::string port;
  std::string error;
};

}  // namespace

bool web_server_has_ipv6() { return mg_check_feature(8) != 0; }

namespace {

SplitAddress split(const std::string& address) {
  SplitAddress out;
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    out.error = "expected host:port or :port";
    return out;
  }
  out.host = address.substr(0, colon);
  out.port = address.substr(colon + 1);
  if (!out.host.empty() && out.host.front() == '[') {
    if (out.host.back() != ']') {
      out.error = "unbalanced [ in IPv6 address";
      return out;
    }
    out.host = out.host.substr(1, out.host.size() - 2);
    out.ipv6 = true;
  }
  if (out.port.empty() || out.port.size() > 5 ||
      out.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(out.port) > 65535) {
    out.error = "invalid port '" + out.port + "'";
    return out;
  }
  if (out.host == "localhost") out.host = "127.0.0.1";
  if (out.ipv6 && !web_server_has_ipv6()) {
    out.error = "IPv6 addresses are not supported: this build's civetweb has no IPv6";
    return out;
  }
  unsigned char buf[sizeof(in6_addr)];
  if (!out.host.empty() && inet_pton(out.ipv6 ? AF_INET6 : AF_INET, out.host.c_str(), buf) != 1) {
    out.error = "invalid IP address '" + out.host + "' (use a numeric address or localhost)";
  }
  return out;
}

// civetweb's C callbacks carry no pointer of ours (CivetServer takes the user data slot),
// so the one live server is reached through this.
std::atomic<const std::function<std::string()>*> g_landing{nullptr};

void send(mg_connection* conn, int status, const char* reason, const char* type,
          const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\r\n",
            status, reason, type, body.size());
  const mg_request_info* info = mg_get_request_info(conn);
  if (std::strcmp(info->request_method, "HEAD") != 0) mg_write(conn, body.data(), body.size());
}

int begin_request(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string uri = info->local_uri ? info->local_uri : "";
  if (uri == "/metrics") return 0;  // prometheus-cpp's handler
  if (uri == "/") {
    const auto* landing = g_landing.load();
    send(conn, 200, "OK", "text/html; charset=utf-8", landing ? (*landing)() : "");
    return 200;
  }
  send(conn, 404, "Not Found", "text/plain; charset=utf-8", "404 page not found\n");
  return 404;
}

}  // namespace

std::string validate_listen_address(const std::string& address) { return split(address).error; }

std::string civetweb_listen_spec(const std::string& address) {
  const SplitAddress a = split(address);
  if (!a.error.empty()) throw std::invalid_argument(address + ": " + a.error);
  // All interfaces: IPv4 and IPv6 where civetweb has IPv6, else IPv4.
  if (a.host.empty()) return web_server_has_ipv6() ? "+" + a.port : "0.0.0.0:" + a.port;
  if (a.ipv6) return "[" + a.host + "]:" + a.port;
  return a.host + ":" + a.port;
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

WebServer::WebServer(const std::string& listen_address,
                     std::shared_ptr<prometheus::Collectable> metrics,
                     std::function<std::string()> landing_html)
    : metrics_(std::move(metrics)), landing_html_(std::move(landing_html)) {
  static CivetCallbacks callbacks = [] {
    CivetCallbacks cb;
    std::memset(static_cast<void*>(&cb), 0, sizeof cb);
    cb.begin_request = begin_request;
    return cb;
  }();
  std::vector<std::string> options = {
      "listening_ports",
      civetweb_listen_spec(listen_address),
      "num_threads",
      "4",
      // A stalled client must not hold a worker forever.
      "request_timeout_ms",
      "10000",
  };
  g_landing.store(&landing_html_);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options, &callbacks);
  } catch (const std::exception& e) {
    g_landing.store(nullptr);
    throw std::runtime_error("cannot listen on " + listen_address + ": " + e.what());
  }
  exposer_->RegisterCollectable(metrics_, "/metrics");
}

WebServer::~WebServer() {
  exposer_.reset();
  g_landing.store(nullptr);
}

std::vector<int> WebServer::ports() const { return exposer_->GetListeningPorts(); }

}  // namespace ebpf_metricsd
