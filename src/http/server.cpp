#include "ebpf_metricsd/http/server.h"

#include <arpa/inet.h>
#include <gnutls/abstract.h>
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
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "deadline_watch.h"
#include "ebpf_metricsd/base/gzip.h"
#include "ebpf_metricsd/http/basic_auth.h"
#include "ebpf_metricsd/http/request_grammar.h"
#include "ebpf_metricsd/http/tls.h"
#include "work_queue.h"

namespace ebpf_metricsd {

namespace {

using http_internal::DeadlineWatch;
using http_internal::DelayedJobs;
using http_internal::WatchedSocket;
using http_internal::WorkQueue;

// Each connection's memory for the request head, the library's record of each header field
// (64 bytes apiece) and the response head: room for the largest head the server accepts
// (kMaxRequestHeadBytes with kMaxHeaderFields fields, request_grammar.h), so that those two
// limits, not how the library packs them, decide what is refused (431; 414 when the request
// line alone does not fit). Over 32 KiB the library maps it for each connection and unmaps
// it at close, so a burst of connections leaves nothing behind.
constexpr std::size_t kConnectionMemory = 40 * 1024;
// bcrypt checks waiting for a turn; past this a request that needs one gets 503 at once.
constexpr std::size_t kMaxWaitingBcrypt = 64;

unsigned event_threads(unsigned cores) { return std::clamp(cores, 2u, 8u); }
unsigned worker_threads(unsigned cores) { return std::clamp(cores, 1u, 8u); }  // bcrypt, rendering

// Whether an Accept-Encoding value accepts gzip (with a q-value above 0).
bool accepts_gzip(std::optional<std::string_view> header) {
  if (!header) return false;
  for (const HeaderListElement& e : parse_header_list(*header)) {
    if (e.token == "gzip") return e.q > 0;
  }
  return false;
}

HttpResponse text(int status, std::string message) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(message) + "\n";
  return r;
}

// Gzips a compressible response when the client accepts it (and says that it varies).
void finish(HttpResponse& r, bool gzip_ok) {
  if (!r.compressible) return;
  r.compressible = false;
  if (gzip_ok) {
    // Level 1: metrics text is so repetitive that it already shrinks ~11x, at a third of
    // the default level's time (bench/exposition_bench).
    if (auto z = gzip(r.body, Z_BEST_SPEED)) {
      r.body = std::move(*z);
      r.headers.emplace_back("Content-Encoding", "gzip");
    }
  }
  r.headers.emplace_back("Vary", "Accept-Encoding");
}

HttpResponse busy(std::string message) {
  HttpResponse r = text(503, std::move(message));
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

// One open connection. Its TLS credentials are those current when it started: libmicrohttpd
// ends the GnuTLS session (gnutls_deinit) before it reports the connection closed, where
// this is freed, so the session never outlives them.
// A request's progress across calls of the access handler; work done on a worker thread
// leaves its result here and resumes the connection.
struct PendingRequest {
  enum class Auth { Unchecked, Allowed, Denied, Unavailable } auth = Auth::Unchecked;
  std::optional<HttpResponse> response;  // from a limited route's worker
  // The request-target as received, before the library decodes it in place, and where it
  // stood in the library's copy of the request line.
  std::string raw_target;
  const char* raw_target_at = nullptr;
  bool head_checked = false;
};

struct Connection {
  WatchedSocket socket;
  std::shared_ptr<const TlsCredentials> tls;
  // Its request in progress. Owned here, not by the library's request context: where the
  // library ends a request itself before the access handler saw it (a request line it will
  // not take), it calls no completion for it, and the request goes with the connection.
  std::unique_ptr<PendingRequest> pending;
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
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= wanted + kDescriptorsForTheRest) {
    return wanted;
  }
  const std::size_t fit =
      lim.rlim_cur > kDescriptorsForTheRest + 16 ? lim.rlim_cur - kDescriptorsForTheRest : 16;
  spdlog::warn(
      "web.max_connections {} does not fit the file descriptor limit {} (RLIMIT_NOFILE); "
      "serving at most {} connections",
      wanted, lim.rlim_cur, fit);
  return fit;
}

// The certificate comes from the credentials each connection is given as it starts
// (Impl::on_connection); libmicrohttpd only needs a source of one to start with TLS.
int no_certificate(gnutls_session_t, const gnutls_datum_t*, int, const gnutls_pk_algorithm_t*, int,
                   gnutls_pcert_st**, unsigned int*, gnutls_privkey_t*) {
  return -1;
}

}  // namespace

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  const std::string key = ascii_lower(name);
  for (const auto& [n, v] : headers) {
    if (n == key) return v;
  }
  return std::nullopt;
}

std::vector<std::string_view> HttpRequest::params(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const auto& [n, v] : query) {
    if (n == name) out.push_back(v);
  }
  return out;
}

unsigned sizing_cores() {
  if (const char* forced = std::getenv("EBPF_METRICSD_SIZING_CORES")) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(forced, &end, 10);
    if (end != forced && *end == '\0' && n >= 1 && n <= 4096) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

unsigned web_server_threads(unsigned cores) {
  return event_threads(cores) + 2 * worker_threads(cores) + 2;
}

struct WebServer::Impl {
  WebSettings settings;
  std::map<std::string, Route, std::less<>> routes;
  BasicAuth auth;
  std::mutex tls_mutex;  // guards tls, which reload_tls replaces
  std::shared_ptr<const TlsCredentials> tls;
  std::atomic<std::size_t> limited_in_flight{0};
  std::atomic<std::size_t> open_connections{0};
  std::size_t connection_limit = 0;  // max_connections, or fewer where descriptors are short
  int listen_fd = -1;
  int port = 0;
  DeadlineWatch watch;
  WorkQueue bcrypt;
  WorkQueue render;
  std::mutex deferred_mutex;                                         // guards deferred_waiting
  std::map<std::string, std::size_t, std::less<>> deferred_waiting;  // by route path
  DelayedJobs delayed;
  MHD_Daemon* daemon = nullptr;

  Impl(WebSettings s, std::vector<Route> r)
      : settings(std::move(s)),
        auth(settings.security.basic_auth_users, worker_threads(sizing_cores())),
        bcrypt(worker_threads(sizing_cores()), kMaxWaitingBcrypt),
        render(worker_threads(sizing_cores()), settings.max_requests) {
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

  static MHD_Result on_accept(void* cls, const sockaddr* addr, socklen_t len) noexcept;
  static void on_connection(void* cls, MHD_Connection* connection, void** socket_context,
                            MHD_ConnectionNotificationCode code) noexcept;
  static void on_completed(void* cls, MHD_Connection* connection, void** request_context,
                           MHD_RequestTerminationCode code) noexcept;
  static void* on_request_line(void* cls, const char* uri, MHD_Connection*) noexcept;
  // Refuses a request head outside the grammar (request_grammar.h): the answer to send, or
  // nothing when the request may go on.
  std::optional<HttpResponse> check_head(MHD_Connection* connection, const char* method,
                                         const char* version, const PendingRequest& pending);
  static MHD_Result on_request(void* cls, MHD_Connection* connection, const char* url,
                               const char* method, const char* version, const char* upload_data,
                               size_t* upload_data_size, void** request_context) noexcept;
  MHD_Result request(MHD_Connection* connection, const char* url, const char* method,
                     PendingRequest& pending);
  // Settles pending.auth now (true), or queues a bcrypt check that will, with the connection
  // suspended until then (false).
  bool authenticate(MHD_Connection* connection, PendingRequest& pending);
  MHD_Result render_off_loop(MHD_Connection* connection, const Route& route, HttpRequest req,
                             bool gzip_ok, PendingRequest& pending);
  MHD_Result answer_later(MHD_Connection* connection, const Route& route, const HttpRequest& req,
                          bool gzip_ok, PendingRequest& pending);
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

// The request's values of one kind (headers, decoded query parameters), copied: a handler
// may run on another thread after this one moved on. Header names are lower-cased.
std::vector<std::pair<std::string, std::string>> values_of(MHD_Connection* c, MHD_ValueKind kind) {
  std::vector<std::pair<std::string, std::string>> out;
  MHD_get_connection_values(
      c, kind,
      [](void* cls, MHD_ValueKind k, const char* key, const char* value) -> MHD_Result {
        const std::string name = key ? key : "";
        static_cast<std::vector<std::pair<std::string, std::string>>*>(cls)->emplace_back(
            k == MHD_HEADER_KIND ? ascii_lower(name) : name, value ? value : "");
        return MHD_YES;
      },
      &out);
  return out;
}

// What libmicrohttpd (0.9.75) made of the request head, checked against the head itself.
// The fields it reports point into its one copy of the head, in order, with the separators
// overwritten by NULs: "name\0 value\0\0name\0value\0\0\0\0". Between the request line and
// the first field, between fields and after the last only line ends may stand, and between a
// name and its value only the colon and blanks. A line the library left out (an empty name
// as the last field) or a folded line it appended to a field's name shows here.
std::optional<GrammarError> check_head_layout(
    const char* method, std::size_t head_size, const char* version,
    const std::vector<std::pair<std::string_view, std::string_view>>& fields) {
  const char* const head_end = method + head_size;
  const auto inside = [&](const char* p) { return p >= method && p <= head_end; };
  const auto only = [](const char* from, const char* to, std::string_view allowed) {
    for (const char* p = from; p < to; ++p) {
      if (allowed.find(*p) == std::string_view::npos) return false;
    }
    return true;
  };
  static constexpr std::string_view kLineEnd("\0\r\n", 3);
  static constexpr std::string_view kColonAndBlanks("\0: \t", 4);
  const GrammarError garbled{400, "a header line that is not a field (folded, or without a name)"};
  const char* at = version + std::strlen(version);
  if (!inside(at)) return std::nullopt;  // not laid out as known: nothing to compare
  for (const auto& [name, value] : fields) {
    const char* name_at = name.data();
    const char* value_at = value.data();
    if (!inside(name_at) || !inside(value_at) || name_at < at) return garbled;
    if (name_at == at || !only(at, name_at, kLineEnd)) return garbled;
    const char* name_end = name_at + name.size();
    if (value_at < name_end + 1 || !only(name_end, value_at, kColonAndBlanks)) return garbled;
    at = value_at + value.size();
  }
  if (at > head_end || !only(at, head_end, kLineEnd)) return garbled;
  return std::nullopt;
}

}  // namespace

MHD_Result WebServer::Impl::on_accept(void* cls, const sockaddr*, socklen_t) noexcept {
  // libmicrohttpd splits its own limit among the event loops, and a loop at its share stops
  // accepting (clients would wait in the backlog): the total is counted here instead, and a
  // connection past it is closed at once.
  auto* self = static_cast<Impl*>(cls);
  return self->open_connections.load() < self->connection_limit ? MHD_YES : MHD_NO;
}

void WebServer::Impl::on_connection(void* cls, MHD_Connection* connection, void** socket_context,
                                    MHD_ConnectionNotificationCode code) noexcept {
  auto* self = static_cast<Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* c = new (std::nothrow) Connection();
    if (!c) return;  // not watched: libmicrohttpd's own timeout still ends it
    const MHD_ConnectionInfo* fd =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->socket.fd = fd ? fd->connect_fd : -1;
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
    ++self->open_connections;
    try {
      self->watch.add(&c->socket, self->settings.request_timeout);
    } catch (...) {
      shutdown(c->socket.fd, SHUT_RDWR);  // cannot be watched: not served either
    }
    return;
  }
  auto* c = static_cast<Connection*>(*socket_context);
  if (!c) return;
  self->watch.remove(&c->socket);
  --self->open_connections;
  delete c;
  *socket_context = nullptr;
}

void WebServer::Impl::on_completed(void* cls, MHD_Connection* connection, void** request_context,
                                   MHD_RequestTerminationCode) noexcept {
  auto* self = static_cast<Impl*>(cls);
  if (Connection* c = connection_of(connection)) {
    if (c->pending.get() == *request_context) c->pending.reset();
    self->watch.arm(&c->socket, self->settings.idle_timeout);
  }
  *request_context = nullptr;
}

namespace {
// A new request on `connection`, owned by it; nullptr without a connection of ours.
PendingRequest* new_pending(MHD_Connection* connection) {
  Connection* c = connection_of(connection);
  if (!c) return nullptr;
  c->pending = std::make_unique<PendingRequest>();
  return c->pending.get();
}
}  // namespace

void* WebServer::Impl::on_request_line(void*, const char* uri,
                                       MHD_Connection* connection) noexcept {
  try {
    PendingRequest* pending = new_pending(connection);
    if (pending) {
      pending->raw_target = uri ? uri : "";
      pending->raw_target_at = uri;
    }
    return pending;
  } catch (...) {
    return nullptr;  // on_request makes one; the raw target is then unknown, and refused
  }
}

std::optional<HttpResponse> WebServer::Impl::check_head(MHD_Connection* connection,
                                                        const char* method, const char* version,
                                                        const PendingRequest& pending) {
  std::optional<GrammarError> error;
  // libmicrohttpd (0.9.75) hands over pointers into its one copy of the request line, with
  // the separators overwritten by NULs: "GET\0/target\0HTTP/1.1". A target that does not
  // begin right after the method's separator followed more than one space; one whose
  // version does not begin right after its end held a NUL byte, which a C string hides.
  if (pending.raw_target_at == nullptr) {
    error = GrammarError{400, "the request line could not be read"};
  } else if (pending.raw_target_at != method + std::strlen(method) + 1) {
    error = GrammarError{400, "more than one space after the method"};
  } else if (version[0] != '\0' &&
             version != pending.raw_target_at + pending.raw_target.size() + 1) {
    error = GrammarError{400, "a NUL byte or a second space in the request-target"};
  } else {
    error = check_request_target(pending.raw_target);
  }
  std::vector<std::pair<std::string_view, std::string_view>> fields;
  MHD_get_connection_values_n(
      connection, MHD_HEADER_KIND,
      [](void* cls, MHD_ValueKind, const char* key, size_t key_size, const char* value,
         size_t value_size) -> MHD_Result {
        static_cast<std::vector<std::pair<std::string_view, std::string_view>>*>(cls)->emplace_back(
            std::string_view(key ? key : "", key ? key_size : 0),
            std::string_view(value ? value : "", value ? value_size : 0));
        return MHD_YES;
      },
      &fields);
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
  if (!error && info && info->header_size > kMaxRequestHeadBytes) {
    const std::size_t line =
        std::strlen(method) + pending.raw_target.size() + std::strlen(version) + 2;
    error = line > kMaxRequestHeadBytes
                ? GrammarError{414, "a request line over " +
                                        std::to_string(kMaxRequestHeadBytes / 1024) + " KiB"}
                : GrammarError{431, "a request head over " +
                                        std::to_string(kMaxRequestHeadBytes / 1024) + " KiB"};
  }
  if (!error && info) error = check_head_layout(method, info->header_size, version, fields);
  if (!error) error = check_header_fields(fields, version);
  if (!error) return std::nullopt;
  spdlog::debug("web server: refused a request ({}): {}", error->status, error->reason);
  HttpResponse r = text(error->status, std::to_string(error->status) + " " + error->reason);
  r.headers.emplace_back("Connection", "close");
  return r;
}

MHD_Result WebServer::Impl::on_request(void* cls, MHD_Connection* connection, const char* url,
                                       const char* method, const char* version, const char*,
                                       size_t* upload_data_size, void** request_context) noexcept {
  auto* self = static_cast<Impl*>(cls);
  try {
    auto* pending = static_cast<PendingRequest*>(*request_context);
    const std::string_view m(method);
    if (!pending) {
      pending = new_pending(connection);
      if (!pending) return MHD_NO;  // not a connection of ours: closed
      *request_context = pending;
    }
    if (!pending->head_checked) {
      pending->head_checked = true;
      // The library calls again once the request is whole; answering a GET now would cost
      // the connection its keep-alive. Any other method is answered at once, body unread.
      if (m == "GET" || m == "HEAD") {
        // A head outside the grammar is answered now, with the connection closed after.
        auto refusal = self->check_head(connection, method, version, *pending);
        if (!refusal) return MHD_YES;
        if (Connection* c = connection_of(connection)) self->watch.disarm(&c->socket);
        return self->send(connection, std::move(*refusal), false);
      }
    } else if (*upload_data_size != 0) {
      *upload_data_size = 0;  // a body is dropped (within the deadline); no route takes one
      return MHD_YES;
    }
    // The request is whole: the deadline waits until there is a response to send.
    if (Connection* c = connection_of(connection)) self->watch.disarm(&c->socket);
    return self->request(connection, url, method, *pending);
  } catch (const std::exception& e) {
    spdlog::error("web server: {} {}: {}", method, url, e.what());
  } catch (...) {
    spdlog::error("web server: {} {}: failed", method, url);
  }
  return MHD_NO;  // the library closes the connection
}

MHD_Result WebServer::Impl::request(MHD_Connection* connection, const char* url, const char* method,
                                    PendingRequest& pending) {
  using Auth = PendingRequest::Auth;
  const std::string_view m(method), path(url);
  if (m != "GET" && m != "HEAD") {
    HttpResponse r = text(405, "405 method not allowed");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return send(connection, std::move(r), false);
  }
  if (path.empty() || path.front() != '/') {
    return send(connection, text(400, "400 bad request"), false);
  }
  if (pending.auth == Auth::Unchecked && !authenticate(connection, pending)) return MHD_YES;
  if (pending.auth == Auth::Unavailable) {
    return send(connection, busy("503 too many credential checks waiting"), false);
  }
  if (pending.auth == Auth::Denied) {
    HttpResponse r = text(401, "401 Unauthorized");
    r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"ebpf-metricsd\", charset=\"UTF-8\"");
    return send(connection, std::move(r), false);
  }
  const bool gzip_ok = accepts_gzip(header_of(connection, MHD_HTTP_HEADER_ACCEPT_ENCODING));
  if (pending.response) return send(connection, std::move(*pending.response), gzip_ok);
  const auto it = routes.find(path);
  if (it == routes.end()) return send(connection, text(404, "404 page not found"), false);
  // The target's grammar was checked first: the library's decoding of the query is safe.
  HttpRequest req{std::string(m), std::string(path), values_of(connection, MHD_HEADER_KIND),
                  values_of(connection, MHD_GET_ARGUMENT_KIND)};
  if (it->second.deferred) return answer_later(connection, it->second, req, gzip_ok, pending);
  if (it->second.limited) {
    return render_off_loop(connection, it->second, std::move(req), gzip_ok, pending);
  }
  return send(connection, it->second.handler(req), gzip_ok);
}

bool WebServer::Impl::authenticate(MHD_Connection* connection, PendingRequest& pending) {
  using Auth = PendingRequest::Auth;
  // Two Authorization headers are refused: which one counts is not for a client to choose.
  int count = 0;
  MHD_get_connection_values(
      connection, MHD_HEADER_KIND,
      [](void* cls, MHD_ValueKind, const char* key, const char*) -> MHD_Result {
        if (key && strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0) ++*static_cast<int*>(cls);
        return MHD_YES;
      },
      &count);
  const auto header = header_of(connection, MHD_HTTP_HEADER_AUTHORIZATION);
  const std::optional<bool> quick =
      count > 1 ? std::optional<bool>(false) : auth.check_without_bcrypt(header);
  if (quick) {
    pending.auth = *quick ? Auth::Allowed : Auth::Denied;
    return true;
  }
  // bcrypt is slow on purpose: it runs on a worker while this connection waits suspended,
  // and the event loop serves the others. The job always resumes the connection.
  WorkQueue::Job job{[this, connection, &pending, value = std::string(*header)] {
                       Auth verdict = Auth::Denied;
                       try {
                         verdict =
                             auth.check(std::string_view(value)) ? Auth::Allowed : Auth::Denied;
                       } catch (...) {
                         verdict = Auth::Unavailable;
                       }
                       pending.auth = verdict;
                       MHD_resume_connection(connection);
                     },
                     [connection, &pending] {
                       pending.auth = Auth::Unavailable;
                       MHD_resume_connection(connection);
                     }};
  if (bcrypt.submit(std::move(job), [connection] { MHD_suspend_connection(connection); })) {
    return false;
  }
  pending.auth = Auth::Unavailable;
  return true;
}

MHD_Result WebServer::Impl::render_off_loop(MHD_Connection* connection, const Route& route,
                                            HttpRequest req, bool gzip_ok,
                                            PendingRequest& pending) {
  if (limited_in_flight.fetch_add(1) >= settings.max_requests) {
    --limited_in_flight;
    return send(connection, busy("503 too many concurrent scrapes (web.max_requests)"), false);
  }
  WorkQueue::Job job{[this, connection, &pending, &route, gzip_ok, req = std::move(req)] {
                       try {
                         HttpResponse r = route.handler(req);
                         finish(r, gzip_ok);  // here, not on the event loop
                         pending.response = std::move(r);
                       } catch (const std::exception& e) {
                         spdlog::error("web server: {} {}: {}", req.method, req.path, e.what());
                         pending.response = text(500, "500 internal error");
                       }
                       --limited_in_flight;
                       MHD_resume_connection(connection);
                     },
                     [this, connection, &pending] {
                       pending.response = busy("503 the server is stopping");
                       --limited_in_flight;
                       MHD_resume_connection(connection);
                     }};
  if (render.submit(std::move(job), [connection] { MHD_suspend_connection(connection); })) {
    return MHD_YES;
  }
  --limited_in_flight;
  return send(connection, busy("503 the server is stopping"), false);
}

MHD_Result WebServer::Impl::answer_later(MHD_Connection* connection, const Route& route,
                                         const HttpRequest& req, bool gzip_ok,
                                         PendingRequest& pending) {
  {
    std::lock_guard lock(deferred_mutex);
    std::size_t& waiting = deferred_waiting[route.path];
    if (waiting >= route.max_deferred) {
      return send(connection,
                  busy("503 " + std::to_string(route.max_deferred) + " requests of " + route.path +
                       " are waiting already"),
                  false);
    }
    ++waiting;
  }
  const auto done_waiting = [this, path = route.path] {
    std::lock_guard lock(deferred_mutex);
    --deferred_waiting[path];
  };
  std::variant<HttpResponse, DeferredResponse> first;
  try {
    first = route.deferred(req);
  } catch (const std::exception& e) {
    spdlog::error("web server: {} {}: {}", req.method, req.path, e.what());
    first = text(500, "500 internal error");
  }
  if (auto* now = std::get_if<HttpResponse>(&first)) {
    done_waiting();
    return send(connection, std::move(*now), gzip_ok);
  }
  auto later = std::get<DeferredResponse>(std::move(first));
  // `begin` and, after the wait, the answer are made on rendering workers; the wait holds no
  // thread. At stop, a request still waiting gets 503. On every path the connection is
  // resumed exactly once.
  auto resume = [connection, &pending, done_waiting](HttpResponse r) {
    pending.response = std::move(r);
    done_waiting();
    MHD_resume_connection(connection);
  };
  auto stopping = [resume] { resume(busy("503 the server is stopping")); };
  auto on_worker = [this, resume, stopping](const std::function<HttpResponse()>& make) {
    WorkQueue::Job job{[resume, make] { resume(make()); }, stopping};
    if (!render.submit(std::move(job), [] {})) {
      resume(busy("503 too many requests being answered (web.max_requests)"));
    }
  };
  const auto made = [gzip_ok, method = req.method,
                     path = req.path](const std::function<HttpResponse()>& make) {
    HttpResponse r;
    try {
      r = make();
      finish(r, gzip_ok);
    } catch (const std::exception& e) {
      spdlog::error("web server: {} {}: {}", method, path, e.what());
      r = text(500, "500 internal error");
    }
    return r;
  };
  auto after_wait = [this, on_worker, stopping, made, wait = later.wait,
                     answer = std::move(later.answer)] {
    WorkQueue::Job job{
        [on_worker, made, answer] { on_worker([made, answer] { return made(answer); }); },
        stopping};
    // Scheduled from a worker: the connection is suspended already, nothing to do before.
    if (!delayed.submit(wait, std::move(job), [] {})) stopping();
  };
  auto start = [this, resume, stopping, after_wait, begin = std::move(later.begin)]() mutable {
    if (!begin) return after_wait();
    WorkQueue::Job job{[resume, after_wait, begin] {
                         try {
                           begin();
                         } catch (const std::exception& e) {
                           spdlog::error("web server: a deferred answer failed to begin: {}",
                                         e.what());
                           return resume(text(500, "500 internal error"));
                         }
                         after_wait();
                       },
                       stopping};
    if (!render.submit(std::move(job), [] {})) stopping();
  };
  // Suspended first, so that whatever resumes it finds it suspended.
  MHD_suspend_connection(connection);
  start();
  return MHD_YES;
}

MHD_Result WebServer::Impl::send(MHD_Connection* connection, HttpResponse r, bool gzip_ok) {
  finish(r, gzip_ok);
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
  if (Connection* c = connection_of(connection)) watch.arm(&c->socket, settings.request_timeout);
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
  connection_limit = connections_that_fit(settings.max_connections);
  // libmicrohttpd's own inactivity timeout is only a backstop behind the deadline watch.
  const auto backstop = std::chrono::ceil<std::chrono::seconds>(
      2 * std::max(settings.request_timeout, settings.idle_timeout) + std::chrono::seconds(1));
  const auto loops = static_cast<intptr_t>(event_threads(sizing_cores()));
  std::vector<MHD_OptionItem> options = {
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&log_from_library), nullptr},
      {MHD_OPTION_LISTEN_SOCKET, listen_fd, nullptr},
      {MHD_OPTION_THREAD_POOL_SIZE, loops, nullptr},
      // Each event loop's share of this never binds: on_accept (the accept policy) counts
      // the total.
      {MHD_OPTION_CONNECTION_LIMIT, static_cast<intptr_t>(connection_limit * loops + loops),
       nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT,
       static_cast<intptr_t>(settings.max_connections_per_address), nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, static_cast<intptr_t>(backstop.count()), nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(kConnectionMemory), nullptr},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Impl::on_connection), this},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::on_completed), this},
      {MHD_OPTION_URI_LOG_CALLBACK, reinterpret_cast<intptr_t>(&Impl::on_request_line), this},
      {MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, nullptr},
  };
  if (tls) {
    options.push_back(
        {MHD_OPTION_HTTPS_CERT_CALLBACK, 0, reinterpret_cast<void*>(&no_certificate)});
    options.push_back(
        {MHD_OPTION_HTTPS_PRIORITIES, 0, const_cast<char*>(tls->priorities().c_str())});
  }
  options.push_back({MHD_OPTION_END, 0, nullptr});
  daemon = MHD_start_daemon(flags, 0, &Impl::on_accept, this, &Impl::on_request, this,
                            MHD_OPTION_ARRAY, options.data(), MHD_OPTION_END);
  // On failure the library has closed the listening socket itself, on most paths; closing
  // it again could close a descriptor another thread just opened, so it is left.
  if (!daemon)
    throw std::runtime_error("cannot start the web server on " + settings.listen_address);
}

void WebServer::Impl::stop() {
  // Every suspended connection is resumed before the library stops (it refuses to stop with
  // one suspended): the waiting jobs are cancelled, the running ones end.
  delayed.stop();
  bcrypt.stop();
  render.stop();
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
