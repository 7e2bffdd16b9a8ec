#pragma once
// The HTTP and HTTPS server: a thin adapter on libmicrohttpd (event-driven, GnuTLS). It knows
// routes, limits, TLS and basic auth, nothing of what it serves.

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ebpf_metricsd/http/web_config.h"
#include "ebpf_metricsd/http/web_settings.h"

namespace ebpf_metricsd {

// The socket address to bind: ":port" is every interface, IPv6 and IPv4 where the kernel
// has IPv6. Throws std::invalid_argument.
sockaddr_storage resolve_listen_address(const std::string& address, bool ipv6_available);

// File descriptors the server leaves to the rest of the process (tracers' maps, programs and
// perf events, logs) when it fits max_connections under RLIMIT_NOFILE.
inline constexpr std::size_t kDescriptorsForTheRest = 1024;

// The cores the server sizes its thread pools for: the machine's, or, where the environment
// sets EBPF_METRICSD_SIZING_CORES (1 to 4096; for tests), that many. Nothing else reads it:
// the CPUs the kernel reports (possible, online) and every map sized by them stay as they are.
unsigned sizing_cores();
// The threads a server sized for `cores` runs besides its caller's: 2 to 8 event loops, 1 to
// 8 workers each for bcrypt and for rendering, the deadline watch and the timer of deferred
// answers. Fixed, whatever the load, so that TasksMax can be checked.
unsigned web_server_threads(unsigned cores = sizing_cores());
// The most a server runs on any machine (kMaxWebServerThreads == web_server_threads(8)).
inline constexpr unsigned kMaxWebServerThreads = 8 + 2 * 8 + 2;

struct HttpRequest {
  std::string method;  // GET or HEAD
  std::string path;    // without the query
  std::vector<std::pair<std::string, std::string>> headers;
  // The query's parameters, decoded, in order (a name without "=" has an empty value).
  std::vector<std::pair<std::string, std::string>> query;
  // The value of the first header of that name (case-insensitive), or nullopt.
  std::optional<std::string_view> header(std::string_view name) const;
  // The values of query parameter `name`.
  std::vector<std::string_view> params(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool compressible = false;  // gzip it when the client accepts gzip
};

// An answer that comes after a wait, made off the event loop: `begin` (when set) runs on a
// worker thread first, then the wait starts, then `answer` runs on a worker thread.
struct DeferredResponse {
  std::function<void()> begin;
  std::chrono::milliseconds wait{0};
  std::function<HttpResponse()> answer;
};

struct Route {
  std::string path;
  std::function<HttpResponse(const HttpRequest&)> handler;
  // Counts against max_requests and runs on a worker thread, not on an event loop: for
  // handlers that take time (rendering a scrape).
  bool limited = false;
  // Set in place of `handler` for routes that answer after a wait (a profile of the next N
  // seconds): it runs on the event loop and returns a response now (a refusal) or a
  // DeferredResponse. The connection waits suspended, holding no thread; at most
  // `max_deferred` requests of the route wait at once (503 beyond).
  std::function<std::variant<HttpResponse, DeferredResponse>(const HttpRequest&)> deferred = {};
  std::size_t max_deferred = 0;
};

// GET and HEAD on the routes' paths, 404 elsewhere, 405 for other methods. With
// basic_auth_users every path asks for credentials (401). Malformed requests get 400, too
// long a URI 414, too large a head 431, all from libmicrohttpd.
class WebServer {
 public:
  // Binds the listen address and serves until destroyed. Throws std::runtime_error when the
  // address cannot be bound or the TLS files cannot be used.
  WebServer(WebSettings settings, std::vector<Route> routes);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  int port() const;
  // Loads the certificate, key and CA files again (rotated on disk) for the connections
  // from now on; the listener and the connections open stay. Throws std::runtime_error and
  // keeps the loaded ones when they do not load.
  void reload_tls();
  const WebSettings& settings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ebpf_metricsd
