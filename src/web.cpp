#include "ebpf_metricsd/web.h"

#include "ebpf_metricsd/basic_auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace ebpf_metricsd {

namespace {

using Clock = std::chrono::steady_clock;

struct SplitAddress {
  std::string host;  // without brackets; "" = all interfaces
  bool ipv6 = false;
  std::string port;
  std::string error;
};

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
  unsigned char buf[sizeof(in6_addr)];
  if (!out.host.empty() && inet_pton(out.ipv6 ? AF_INET6 : AF_INET, out.host.c_str(), buf) != 1) {
    out.error = "invalid IP address '" + out.host + "' (use a numeric address or localhost)";
  }
  return out;
}

constexpr std::size_t kMaxRequestBytes = 16 * 1024;
constexpr std::size_t kQueueLimit = 128;

// A plain or TLS connection on a non-blocking socket (which the caller closes); every
// operation ends by a deadline.
class Connection {
 public:
  Connection(int fd, SSL_CTX* tls) : fd_(fd), tls_(tls != nullptr) {
    if (tls) {
      ssl_ = SSL_new(tls);
      if (ssl_) SSL_set_fd(ssl_, fd_);
    }
  }
  ~Connection() {
    if (ssl_) {
      if (handshaken_) SSL_shutdown(ssl_);  // best effort, non-blocking
      SSL_free(ssl_);
    }
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // TLS handshake (nothing for plain connections).
  bool handshake(Clock::time_point deadline) {
    if (!tls_) return true;
    if (!ssl_) return false;  // never fall back to plain text on a TLS port
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(ssl_);
      if (r == 1) {
        handshaken_ = true;
        return true;
      }
      if (!wait_for(SSL_get_error(ssl_, r), deadline)) return false;
    }
  }

  // Bytes read (> 0), 0 at end of stream, -1 on error or deadline.
  ssize_t read_some(char* buf, std::size_t len, Clock::time_point deadline) {
    for (;;) {
      if (ssl_) {
        ERR_clear_error();
        const int r = SSL_read(ssl_, buf, static_cast<int>(len));
        if (r > 0) return r;
        const int err = SSL_get_error(ssl_, r);
        if (err == SSL_ERROR_ZERO_RETURN) return 0;
        if (!wait_for(err, deadline)) return -1;
      } else {
        const ssize_t r = recv(fd_, buf, len, 0);
        if (r >= 0) return r;
        if (errno != EAGAIN && errno != EINTR) return -1;
        if (!wait_for(SSL_ERROR_WANT_READ, deadline)) return -1;
      }
    }
  }

  bool write_all(std::string_view data, Clock::time_point deadline) {
    while (!data.empty()) {
      if (ssl_) {
        ERR_clear_error();
        const int r = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
        if (r > 0) {
          data.remove_prefix(static_cast<std::size_t>(r));
          continue;
        }
        if (!wait_for(SSL_get_error(ssl_, r), deadline)) return false;
      } else {
        const ssize_t r = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
        if (r > 0) {
          data.remove_prefix(static_cast<std::size_t>(r));
          continue;
        }
        if (r < 0 && errno != EAGAIN && errno != EINTR) return false;
        if (!wait_for(SSL_ERROR_WANT_WRITE, deadline)) return false;
      }
    }
    return true;
  }

 private:
  bool wait_for(int ssl_error, Clock::time_point deadline) {
    short events = 0;
    if (ssl_error == SSL_ERROR_WANT_READ) events = POLLIN;
    if (ssl_error == SSL_ERROR_WANT_WRITE) events = POLLOUT;
    if (events == 0) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, events, 0};
    const int r = poll(&p, 1, static_cast<int>(left.count()));
    return r > 0 || (r < 0 && errno == EINTR);
  }

  int fd_;
  SSL* ssl_ = nullptr;
  bool tls_;
  bool handshaken_ = false;
};

struct Request {
  std::string method;
  std::string path;
  std::string version;
  std::map<std::string, std::string> headers;  // names lower-cased
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Parses the head of a request; the status to answer with when it is malformed.
std::optional<int> parse_request(const std::string& head, Request& req) {
  std::size_t pos = head.find("\r\n");
  const std::string line = head.substr(0, pos);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) return 400;
  req.method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  req.version = line.substr(sp2 + 1);
  if (req.version != "HTTP/1.1" && req.version != "HTTP/1.0") return 400;
  if (target.empty() || target[0] != '/') return 400;
  req.path = target.substr(0, target.find('?'));
  while (pos != std::string::npos && pos + 2 < head.size()) {
    const std::size_t start = pos + 2;
    pos = head.find("\r\n", start);
    const std::string h = head.substr(start, pos == std::string::npos ? pos : pos - start);
    if (h.empty()) break;
    const auto colon = h.find(':');
    if (colon == std::string::npos || colon == 0) return 400;
    std::string value = h.substr(colon + 1);
    const auto b = value.find_first_not_of(" \t");
    const auto e = value.find_last_not_of(" \t");
    value = b == std::string::npos ? "" : value.substr(b, e - b + 1);
    req.headers[lower(h.substr(0, colon))] = value;
  }
  return std::nullopt;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

std::string response(int status, const std::string& type, const std::string& body, bool head_only,
                     const std::string& extra_headers = {}) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                    "\r\nContent-Type: " + type +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                    "Connection: close\r\n" +
                    extra_headers + "\r\n";
  if (!head_only) out += body;
  return out;
}

std::string text_response(int status, const std::string& text, bool head_only,
                          const std::string& extra_headers = {}) {
  return response(status, "text/plain; charset=utf-8", text + "\n", head_only, extra_headers);
}

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

bool accepts_gzip(const Request& req) {
  const auto it = req.headers.find("accept-encoding");
  if (it == req.headers.end()) return false;
  std::stringstream ss(lower(it->second));
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    item = item.substr(b);
    if (item.rfind("gzip", 0) == 0 && item.find("q=0") == std::string::npos) return true;
  }
  return false;
}

}  // namespace

struct WebServer::Shared {
  WebSettings settings;
  std::shared_ptr<prometheus::Collectable> metrics;
  std::function<std::string()> landing;
  std::function<bool()> healthy;
  std::mutex tls_mutex;  // guards tls, which reload_tls replaces
  std::shared_ptr<SSL_CTX> tls;

  std::shared_ptr<SSL_CTX> tls_context() {
    std::lock_guard lock(tls_mutex);
    return tls;
  }
  std::atomic<std::size_t> scrapes_in_flight{0};
  std::unique_ptr<BasicAuth> auth;

  bool authorized(const Request& req);
  std::string handle(const Request& req);
};

bool WebServer::Shared::authorized(const Request& req) {
  const auto h = req.headers.find("authorization");
  return auth->check(h == req.headers.end() ? std::nullopt
                                            : std::optional<std::string_view>(h->second));
}

std::string WebServer::Shared::handle(const Request& req) {
  const bool head = req.method == "HEAD";
  if (req.method != "GET" && !head) {
    return text_response(405, "405 method not allowed", false, "Allow: GET, HEAD\r\n");
  }
  if (!authorized(req)) {
    return text_response(401, "401 Unauthorized", head,
                         "WWW-Authenticate: Basic realm=\"ebpf-metricsd\", charset=\"UTF-8\"\r\n");
  }
  if (req.path == "/metrics") {
    if (scrapes_in_flight.fetch_add(1) >= settings.max_requests) {
      scrapes_in_flight.fetch_sub(1);
      return text_response(503, "503 too many concurrent scrapes (web.max_requests)", head,
                           "Retry-After: 1\r\n");
    }
    std::string body;
    try {
      body = prometheus::TextSerializer().Serialize(metrics->Collect());
    } catch (...) {
      scrapes_in_flight.fetch_sub(1);
      throw;
    }
    scrapes_in_flight.fetch_sub(1);
    const std::string type = "text/plain; version=0.0.4; charset=utf-8";
    if (accepts_gzip(req)) {
      if (auto z = gzip(body)) {
        return response(200, type, *z, head, "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
      }
    }
    return response(200, type, body, head);
  }
  if (req.path == "/") {
    return response(200, "text/html; charset=utf-8", landing ? landing() : "", head);
  }
  if (req.path == "/-/healthy") {
    if (!healthy || healthy()) return text_response(200, "OK", head);
    return text_response(503, "unhealthy: the tracers' maps have not been drained lately", head);
  }
  return text_response(404, "404 page not found", head);
}

std::string validate_listen_address(const std::string& address) { return split(address).error; }

sockaddr_storage resolve_listen_address(const std::string& address, bool ipv6_available) {
  const SplitAddress a = split(address);
  if (!a.error.empty()) throw std::invalid_argument(address + ": " + a.error);
  sockaddr_storage ss{};
  const auto port = htons(static_cast<uint16_t>(std::stoi(a.port)));
  if (a.ipv6 || (a.host.empty() && ipv6_available)) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = port;
    s6->sin6_addr = in6addr_any;
    if (!a.host.empty()) inet_pton(AF_INET6, a.host.c_str(), &s6->sin6_addr);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    s4->sin_family = AF_INET;
    s4->sin_port = port;
    s4->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!a.host.empty()) inet_pton(AF_INET, a.host.c_str(), &s4->sin_addr);
  }
  return ss;
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

WebServer::WebServer(WebSettings settings, std::shared_ptr<prometheus::Collectable> metrics,
                     std::function<std::string()> landing_html, std::function<bool()> healthy)
    : settings_(std::move(settings)), shared_(std::make_shared<Shared>()) {
  shared_->settings = settings_;
  shared_->metrics = std::move(metrics);
  shared_->landing = std::move(landing_html);
  shared_->healthy = std::move(healthy);
  if (settings_.security.tls) {
    try {
      shared_->tls = make_tls_context(*settings_.security.tls);
    } catch (const TlsSetupError& e) {
      throw std::runtime_error("TLS: " + std::string(e.what()));
    }
  }
  shared_->auth = std::make_unique<BasicAuth>(settings_.security.basic_auth_users,
                                              std::max(1u, std::thread::hardware_concurrency()));

  // Every interface means IPv6 and IPv4 on one dual-stack socket where the kernel has IPv6.
  int fd = -1;
  sockaddr_storage addr{};
  for (const bool v6 : {true, false}) {
    addr = resolve_listen_address(settings_.listen_address, v6);
    fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 || errno != EAFNOSUPPORT || addr.ss_family == AF_INET) break;
  }
  if (fd < 0) throw std::runtime_error("socket: " + std::string(std::strerror(errno)));
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  const socklen_t len = addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 128) != 0) {
    const int err = errno;
    close(fd);
    throw std::runtime_error("cannot listen on " + settings_.listen_address + ": " +
                             std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fd_ = fd;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);

  // Room for max_requests scrapes plus clients still sending their requests.
  const std::size_t workers = settings_.max_requests + 4;
  for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  threads_.emplace_back([this] { accept_loop(); });
}

WebServer::~WebServer() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
    // Connections being served end now, not at their deadline: a stalled client must not
    // hold up a restart of the server.
    for (int fd : active_) shutdown(fd, SHUT_RDWR);
  }
  queue_cv_.notify_all();
  const std::uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) {
    // The accept loop also wakes once a second; it sees stopping_ then.
  }
  for (auto& t : threads_) t.join();
  for (int fd : queue_) close(fd);
  close(listen_fd_);
  close(wake_fd_);
}

void WebServer::reload_tls() {
  if (!settings_.security.tls) return;
  std::shared_ptr<SSL_CTX> fresh;
  try {
    fresh = make_tls_context(*settings_.security.tls);
  } catch (const TlsSetupError& e) {
    throw std::runtime_error("TLS: " + std::string(e.what()));
  }
  std::lock_guard lock(shared_->tls_mutex);
  shared_->tls = std::move(fresh);
}

void WebServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, 1000);
    {
      std::lock_guard lock(queue_mutex_);
      if (stopping_) return;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        spdlog::warn("web server: cannot accept a connection: {}", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    std::unique_lock lock(queue_mutex_);
    if (queue_.size() >= kQueueLimit) {
      lock.unlock();
      close(c);  // every worker busy and a long line waiting: shed load
      continue;
    }
    queue_.push_back(c);
    lock.unlock();
    queue_cv_.notify_one();
  }
}

void WebServer::worker_loop() {
  for (;;) {
    int fd;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      fd = queue_.front();
      queue_.pop_front();
      active_.insert(fd);
    }
    serve(fd);
    {
      std::lock_guard lock(queue_mutex_);
      active_.erase(fd);
    }
    close(fd);
  }
}

void WebServer::serve(int fd) {
  const auto tls = shared_->tls_context();  // kept alive for this connection
  Connection conn(fd, tls.get());
  const auto deadline = Clock::now() + settings_.request_timeout;
  if (!conn.handshake(deadline)) return;
  std::string head;
  char buf[4096];
  bool complete = false, too_large = false;
  while (!complete) {
    const ssize_t n = conn.read_some(buf, sizeof buf, deadline);
    if (n <= 0) break;
    head.append(buf, static_cast<std::size_t>(n));
    complete = head.find("\r\n\r\n") != std::string::npos;
    if (!complete && head.size() > kMaxRequestBytes) {
      too_large = true;
      break;
    }
  }
  // A response gets as long again as the request had.
  const auto write_deadline = Clock::now() + settings_.request_timeout;
  if (too_large) {
    conn.write_all(text_response(431, "431 request header too large", false), write_deadline);
    return;
  }
  if (!complete) {
    if (!head.empty() && Clock::now() >= deadline) {
      conn.write_all(text_response(408, "408 request timeout", false), write_deadline);
    }
    return;
  }
  Request req;
  if (const auto bad = parse_request(head.substr(0, head.find("\r\n\r\n") + 2), req)) {
    conn.write_all(text_response(*bad, std::to_string(*bad) + " bad request", false),
                   write_deadline);
    return;
  }
  std::string out;
  try {
    out = shared_->handle(req);
  } catch (const std::exception& e) {
    spdlog::error("web server: {} {}: {}", req.method, req.path, e.what());
    out = text_response(500, "500 internal error", req.method == "HEAD");
  }
  conn.write_all(out, write_deadline);
}

}  // namespace ebpf_metricsd
