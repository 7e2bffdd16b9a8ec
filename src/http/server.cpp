#include "ebpf_metricsd/http/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <spdlog/spdlog.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bcrypt_queue.h"
#include "deadline_watch.h"
#include "ebpf_metricsd/http/basic_auth.h"
#include "ebpf_metricsd/http/tls.h"

namespace ebpf_metricsd {

namespace {

using http_internal::BcryptQueue;
using http_internal::Connection;
using http_internal::DeadlineWatch;

std::optional<std::string> gzip(const std::string& in) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    return std::nullopt;
  }
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int r = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  if (r != Z_STREAM_END) return std::nullopt;
  out.resize(zs.total_out);
  return out;
}

// A request head larger than this (request line and headers) is answered 431 (414 when the
// URI alone is too long); the same memory serves the connection's reads and writes.
constexpr std::size_t kConnectionMemory = 16 * 1024;
// bcrypt checks waiting for a turn; past this a request that needs one gets 503 at once.
constexpr std::size_t kMaxQueuedBcrypt = 64;
// File descriptors kept free for the tracers, log and config files beside the connections.
constexpr rlim_t kReservedDescriptors = 1024;

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }
unsigned event_threads() { return std::clamp(cores(), 2u, 8u); }
unsigned bcrypt_threads() { return std::min(cores(), 8u); }

bool accepts_gzip(std::optional<std::string_view> header) {
  if (!header) return false;
  std::string_view rest = *header;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    if (item.size() >= 4 && strncasecmp(item.data(), "gzip", 4) == 0 &&
        item.find("q=0") == std::string_view::npos &&
        (item.size() == 4 || item[4] == ';' || item[4] == ' ')) {
      return true;
    }
  }
  return false;
}

HttpResponse text(int status, std::string message) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(message) + "\n";
  return r;
}

// A request's progress across calls of the access handler.
struct PendingRequest {
  enum class Auth { Unchecked, Checking, Allowed, Denied } auth = Auth::Unchecked;
};

void log_from_library(void*, const char* format, va_list args) {
  char line[512];
  vsnprintf(line, sizeof line, format, args);
  std::string_view s(line);
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  spdlog::debug("web server: {}", s);
}

// Raises the soft descriptor limit to the hard one, and says how many connections fit.
std::size_t connections_that_fit(std::size_t wanted) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return wanted;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= wanted + kReservedDescriptors) return wanted;
  const std::size_t fit =
      lim.rlim_cur > kReservedDescriptors + 16 ? lim.rlim_cur - kReservedDescriptors : 16;
  spdlog::warn(
      "web.max_connections {} does not fit the file descriptor limit {} (RLIMIT_NOFILE); "
      "serving at most {} connections",
      wanted, lim.rlim_cur, fit);
  return fit;
}

}  // namespace

bool same_server_settings(const WebSettings& a, const WebSettings& b) {
  return a.listen_address == b.listen_address && a.security.text == b.security.text &&
         a.max_requests == b.max_requests && a.max_connections == b.max_connections &&
         a.max_connections_per_address == b.max_connections_per_address &&
         a.request_timeout == b.request_timeout;
}

unsigned web_server_threads() { return event_threads() + bcrypt_threads() + 1; }

struct WebServer::Impl {
  WebSettings settings;
  std::map<std::string, Route, std::less<>> routes;
  BasicAuth auth;
  std::mutex tls_mutex;  // guards tls, which reload_tls replaces
  std::shared_ptr<const TlsCredentials> tls;
  std::atomic<std::size_t> limited_in_flight{0};
  int listen_fd = -1;
  int port = 0;
  DeadlineWatch watch;
  BcryptQueue bcrypt;
  MHD_Daemon* daemon = nullptr;

  Impl(WebSettings s, std::vector<Route> r)
      : settings(std::move(s)),
        auth(settings.security.basic_auth_users, bcrypt_threads()),
        watch(settings.request_timeout),
        bcrypt(bcrypt_threads(), kMaxQueuedBcrypt) {
    for (auto& route : r) {
      const std::string path = route.path;
      routes.emplace(path, std::move(route));
    }
  }

  std::shared_ptr<const TlsCredentials> current_tls() {
    std::lock_guard lock(tls_mutex);
    return tls;
  }

  void bind_listener();
  void start();
  void stop();

  static void on_connection(void* cls, MHD_Connection* connection, void** socket_context,
                            MHD_ConnectionNotificationCode code);
  static void on_completed(void* cls, MHD_Connection* connection, void** request_context,
                           MHD_RequestTerminationCode code);
  static MHD_Result on_request(void* cls, MHD_Connection* connection, const char* url,
                               const char* method, const char* version, const char* upload_data,
                               size_t* upload_data_size, void** request_context);
  MHD_Result request(MHD_Connection* connection, const char* url, const char* method,
                     PendingRequest& pending);
  HttpResponse route(MHD_Connection* connection, std::string_view method, std::string_view path);
  MHD_Result send(MHD_Connection* connection, HttpResponse r, bool gzip_ok);
};

namespace {

Connection* connection_of(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info ? static_cast<Connection*>(info->socket_context) : nullptr;
}

std::optional<std::string_view> header_of(MHD_Connection* c, const char* name) {
  const char* value = nullptr;
  size_t len = 0;
  if (MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, name, std::strlen(name), &value, &len) !=
          MHD_YES ||
      value == nullptr) {
    return std::nullopt;
  }
  return std::string_view(value, len);
}

int count_header(MHD_Connection* c, const char* name) {
  struct Count {
    const char* name;
    int n = 0;
  } count{name};
  MHD_get_connection_values(
      c, MHD_HEADER_KIND,
      [](void* cls, MHD_ValueKind, const char* key, const char*) -> MHD_Result {
        auto* k = static_cast<Count*>(cls);
        if (key && strcasecmp(key, k->name) == 0) ++k->n;
        return MHD_YES;
      },
      &count);
  return count.n;
}

}  // namespace

void WebServer::Impl::on_connection(void* cls, MHD_Connection* connection, void** socket_context,
                                    MHD_ConnectionNotificationCode code) {
  auto* self = static_cast<Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* c = new Connection();
    const MHD_ConnectionInfo* fd = MHD_get_connection_info(connection,
                                                           MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = fd ? fd->connect_fd : -1;
    if (self->settings.security.tls) {
      // The credentials current now serve this connection to its end, also across a reload.
      c->tls = self->current_tls();
      const MHD_ConnectionInfo* session =
          MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
      if (session && session->tls_session) {
        c->tls->apply(static_cast<gnutls_session_t>(session->tls_session));
      }
    }
    *socket_context = c;
    self->watch.add(c);
    return;
  }
  auto* c = static_cast<Connection*>(*socket_context);
  if (!c) return;
  self->watch.remove(c);
  delete c;
  *socket_context = nullptr;
}

void WebServer::Impl::on_completed(void* cls, MHD_Connection* connection, void** request_context,
                                   MHD_RequestTerminationCode) {
  auto* self = static_cast<Impl*>(cls);
  delete static_cast<PendingRequest*>(*request_context);
  *request_context = nullptr;
  // A kept-alive connection's next request head has the same time again.
  if (Connection* c = connection_of(connection)) self->watch.arm(c);
}

MHD_Result WebServer::Impl::on_request(void* cls, MHD_Connection* connection, const char* url,
                                       const char* method, const char*, const char*,
                                       size_t* upload_data_size, void** request_context) {
  auto* self = static_cast<Impl*>(cls);
  auto* pending = static_cast<PendingRequest*>(*request_context);
  const std::string_view m(method);
  const bool answerable = m == "GET" || m == "HEAD";
  if (!pending) {
    *request_context = new PendingRequest();
    // The library calls again once the request is whole; answering a GET now would cost the
    // connection its keep-alive. Any other method is answered at once, its body unread.
    if (answerable) return MHD_YES;
  } else if (*upload_data_size != 0) {
    *upload_data_size = 0;  // a body is dropped (within the deadline); no route takes one
    return MHD_YES;
  }
  // The request is whole: the deadline waits until there is a response to send.
  if (Connection* c = connection_of(connection)) self->watch.disarm(c);
  try {
    return self->request(connection, url, method, *pending);
  } catch (const std::exception& e) {
    spdlog::error("web server: {} {}: {}", method, url, e.what());
    return self->send(connection, text(500, "500 internal error"), false);
  }
}

MHD_Result WebServer::Impl::request(MHD_Connection* connection, const char* url,
                                    const char* method, PendingRequest& pending) {
  using Auth = PendingRequest::Auth;
  const std::string_view m(method), path(url);
  if (m != "GET" && m != "HEAD") {
    HttpResponse r = text(405, "405 method not allowed");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return send(connection, std::move(r), false);
  }
  if (path.empty() || path.front() != '/') return send(connection, text(400, "400 bad request"), false);
  if (pending.auth == Auth::Unchecked) {
    // Two Authorization headers are refused: which one counts is not for a client to choose.
    const bool ambiguous = count_header(connection, MHD_HTTP_HEADER_AUTHORIZATION) > 1;
    const auto header = header_of(connection, MHD_HTTP_HEADER_AUTHORIZATION);
    const std::optional<bool> quick =
        ambiguous ? std::optional<bool>(false) : auth.check_without_bcrypt(header);
    if (quick) {
      pending.auth = *quick ? Auth::Allowed : Auth::Denied;
    } else {
      // bcrypt is slow on purpose: it runs elsewhere while this connection waits, and the
      // event loop serves the others.
      pending.auth = Auth::Checking;
      MHD_suspend_connection(connection);
      const bool queued = bcrypt.submit([this, connection, &pending, value = std::string(*header)] {
        pending.auth = auth.check(std::string_view(value)) ? Auth::Allowed : Auth::Denied;
        MHD_resume_connection(connection);
      });
      if (!queued) {
        MHD_resume_connection(connection);
        pending.auth = Auth::Unchecked;
        HttpResponse r = text(503, "503 too many credential checks waiting");
        r.headers.emplace_back("Retry-After", "1");
        return send(connection, std::move(r), false);
      }
      return MHD_YES;
    }
  }
  if (pending.auth == Auth::Checking) return MHD_YES;  // resumed only once the check is done
  if (pending.auth == Auth::Denied) {
    HttpResponse r = text(401, "401 Unauthorized");
    r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"ebpf-metricsd\", charset=\"UTF-8\"");
    return send(connection, std::move(r), false);
  }
  HttpResponse r = route(connection, m, path);
  return send(connection, std::move(r),
              accepts_gzip(header_of(connection, MHD_HTTP_HEADER_ACCEPT_ENCODING)));
}

HttpResponse WebServer::Impl::route(MHD_Connection* connection, std::string_view method,
                                    std::string_view path) {
  const auto it = routes.find(path);
  if (it == routes.end()) return text(404, "404 page not found");
  const Route& r = it->second;
  HttpRequest req{method, path, [connection](const char* name) { return header_of(connection, name); }};
  if (!r.limited) return r.handler(req);
  if (limited_in_flight.fetch_add(1) >= settings.max_requests) {
    limited_in_flight.fetch_sub(1);
    HttpResponse busy = text(503, "503 too many concurrent scrapes (web.max_requests)");
    busy.headers.emplace_back("Retry-After", "1");
    return busy;
  }
  struct Release {
    std::atomic<std::size_t>& n;
    ~Release() { n.fetch_sub(1); }
  } release{limited_in_flight};
  return r.handler(req);
}

MHD_Result WebServer::Impl::send(MHD_Connection* connection, HttpResponse r, bool gzip_ok) {
  if (r.compressible && gzip_ok) {
    if (auto z = gzip(r.body)) {
      r.body = std::move(*z);
      r.headers.emplace_back("Content-Encoding", "gzip");
    }
  }
  if (r.compressible) r.headers.emplace_back("Vary", "Accept-Encoding");
  auto* body = new std::string(std::move(r.body));
  MHD_Response* response = MHD_create_response_from_buffer_with_free_callback_cls(
      body->size(), body->data(), [](void* cls) { delete static_cast<std::string*>(cls); }, body);
  if (!response) {
    delete body;
    return MHD_NO;
  }
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
  for (const auto& [name, value] : r.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned>(r.status), response);
  MHD_destroy_response(response);
  // From here the response has request_timeout to reach the client.
  if (Connection* c = connection_of(connection)) watch.arm(c);
  return queued;
}

void WebServer::Impl::bind_listener() {
  // Every interface means IPv6 and IPv4 on one dual-stack socket where the kernel has IPv6.
  int fd = -1;
  sockaddr_storage addr{};
  for (const bool v6 : {true, false}) {
    addr = resolve_listen_address(settings.listen_address, v6);
    fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 || errno != EAFNOSUPPORT || addr.ss_family == AF_INET) break;
  }
  if (fd < 0) throw std::runtime_error("socket: " + std::string(std::strerror(errno)));
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  const socklen_t len = addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error("cannot listen on " + settings.listen_address + ": " +
                             std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fd = fd;
}

void WebServer::Impl::start() {
  if (settings.security.tls) {
    try {
      tls = TlsCredentials::load(*settings.security.tls);
    } catch (const TlsSetupError& e) {
      throw std::runtime_error("TLS: " + std::string(e.what()));
    }
  }
  bind_listener();
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG;
  if (tls) flags |= MHD_USE_TLS;
  const auto timeout_s = static_cast<unsigned>(
      std::chrono::ceil<std::chrono::seconds>(settings.request_timeout).count() + 1);
  const std::size_t connections = connections_that_fit(settings.max_connections);
  std::vector<MHD_OptionItem> options = {
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&log_from_library), nullptr},
      {MHD_OPTION_LISTEN_SOCKET, listen_fd, nullptr},
      {MHD_OPTION_THREAD_POOL_SIZE, event_threads(), nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, static_cast<intptr_t>(connections), nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT,
       static_cast<intptr_t>(settings.max_connections_per_address), nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(kConnectionMemory), nullptr},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Impl::on_connection), this},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::on_completed), this},
      {MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, nullptr},
  };
  if (tls) {
    // The credentials given here only satisfy the library at start: every connection gets
    // the current ones as it starts (on_connection), so rotated files need no restart.
    options.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(tls->cert_pem().c_str())});
    options.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(tls->key_pem().c_str())});
    options.push_back(
        {MHD_OPTION_HTTPS_PRIORITIES, 0, const_cast<char*>(tls->priorities().c_str())});
  }
  options.push_back({MHD_OPTION_END, 0, nullptr});
  daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::on_request, this,
                            MHD_OPTION_ARRAY, options.data(), MHD_OPTION_END);
  if (!daemon) {
    close(listen_fd);
    throw std::runtime_error("cannot start the web server on " + settings.listen_address);
  }
}

void WebServer::Impl::stop() {
  // Every connection waiting for bcrypt is resumed before the library stops: it refuses to
  // stop with one still suspended.
  bcrypt.stop();
  if (daemon) MHD_stop_daemon(daemon);  // closes the listener and every connection
  daemon = nullptr;
}

WebServer::WebServer(WebSettings settings, std::vector<Route> routes)
    : impl_(std::make_unique<Impl>(std::move(settings), std::move(routes))) {
  impl_->start();
}

WebServer::~WebServer() { impl_->stop(); }

int WebServer::port() const { return impl_->port; }

const WebSettings& WebServer::settings() const { return impl_->settings; }

void WebServer::reload_tls() {
  if (!impl_->settings.security.tls) return;
  std::shared_ptr<const TlsCredentials> fresh;
  try {
    fresh = TlsCredentials::load(*impl_->settings.security.tls);
  } catch (const TlsSetupError& e) {
    throw std::runtime_error("TLS: " + std::string(e.what()));
  }
  std::lock_guard lock(impl_->tls_mutex);
  impl_->tls = std::move(fresh);
}

}  // namespace ebpf_metricsd
