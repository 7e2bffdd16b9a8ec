#include "ebpf_metricsd/web.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <civetweb.h>
#include <prometheus/exposer.h>

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <strings.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
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

// What the civetweb callbacks need. Their C signatures carry no pointer of ours
// (CivetServer takes the user data slot), so the one live server's state is reached
// through g_state.
struct ServerState {
  std::function<std::string()> landing;
  WebSettings settings;
  std::atomic<std::size_t> in_flight{0};
  // Per user, the SHA-256 of the password that last passed bcrypt: bcrypt is slow on
  // purpose, and a scrape every few seconds should not pay for it each time.
  std::mutex auth_mutex;
  std::map<std::string, std::array<unsigned char, SHA256_DIGEST_LENGTH>> verified;
};

std::mutex g_state_mutex;
std::shared_ptr<ServerState> g_state;

std::shared_ptr<ServerState> current_state() {
  std::lock_guard lock(g_state_mutex);
  return g_state;
}

void send(mg_connection* conn, int status, const char* reason, const char* type,
          const std::string& body, const std::string& extra_headers = {}) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n%s\r\n",
            status, reason, type, body.size(), extra_headers.c_str());
  const mg_request_info* info = mg_get_request_info(conn);
  if (std::strcmp(info->request_method, "HEAD") != 0) mg_write(conn, body.data(), body.size());
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.empty() || in.size() % 4 != 0 || in.size() > 4096) return std::nullopt;
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  std::size_t len = static_cast<std::size_t>(n);
  for (std::size_t k = in.size(); k > 0 && in[k - 1] == '='; --k) --len;
  out.resize(len);
  return out;
}

// A valid hash that no password of a real user is checked against: unknown users cost one
// bcrypt like known ones, so timing does not tell which user names exist.
const std::string& decoy_hash() {
  static const std::string hash = [] {
    char setting[CRYPT_GENSALT_OUTPUT_SIZE];
    if (!crypt_gensalt_rn("$2b$", 10, nullptr, 0, setting, sizeof setting)) return std::string();
    auto data = std::make_unique<crypt_data>();
    const char* out = crypt_r("decoy", setting, data.get());
    return out ? std::string(out) : std::string();
  }();
  return hash;
}

bool authorized(ServerState& st, const mg_connection* conn) {
  const auto& users = st.settings.security.basic_auth_users;
  if (users.empty()) return true;
  const char* header = mg_get_header(conn, "Authorization");
  if (!header) return false;
  std::string_view h(header);
  if (h.size() < 6 || strncasecmp(header, "Basic ", 6) != 0) return false;
  h.remove_prefix(6);
  while (!h.empty() && h.front() == ' ') h.remove_prefix(1);
  const auto decoded = base64_decode(h);
  if (!decoded) return false;
  const auto colon = decoded->find(':');
  if (colon == std::string::npos) return false;
  const std::string user = decoded->substr(0, colon);
  const std::string password = decoded->substr(colon + 1);
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(password.data()), password.size(),
         digest.data());
  const auto it = users.find(user);
  if (it == users.end()) {
    (void)bcrypt_matches(password, decoy_hash());
    return false;
  }
  {
    std::lock_guard lock(st.auth_mutex);
    const auto v = st.verified.find(user);
    if (v != st.verified.end() && CRYPTO_memcmp(v->second.data(), digest.data(), digest.size()) == 0) {
      return true;
    }
  }
  if (!bcrypt_matches(password, it->second)) return false;
  std::lock_guard lock(st.auth_mutex);
  st.verified[user] = digest;
  return true;
}

// Set while this worker thread serves a /metrics request counted in in_flight; civetweb
// runs begin_request, the handler and end_request of one request on one thread.
thread_local std::shared_ptr<ServerState> t_counted;

void release_slot() {
  if (t_counted) {
    t_counted->in_flight.fetch_sub(1);
    t_counted.reset();
  }
}

int begin_request(mg_connection* conn) {
  release_slot();
  const auto st = current_state();
  if (!st) return 0;
  if (!authorized(*st, conn)) {
    send(conn, 401, "Unauthorized", "text/plain; charset=utf-8", "401 Unauthorized\n",
         "WWW-Authenticate: Basic realm=\"ebpf-metricsd\", charset=\"UTF-8\"\r\n");
    return 401;
  }
  const mg_request_info* info = mg_get_request_info(conn);
  const std::string uri = info->local_uri ? info->local_uri : "";
  if (uri == "/metrics") {
    if (st->in_flight.fetch_add(1) >= st->settings.max_requests) {
      st->in_flight.fetch_sub(1);
      send(conn, 503, "Service Unavailable", "text/plain; charset=utf-8",
           "503 too many concurrent scrapes (web.max_requests)\n", "Retry-After: 1\r\n");
      return 503;
    }
    t_counted = st;
    return 0;  // prometheus-cpp's handler
  }
  if (uri == "/") {
    send(conn, 200, "OK", "text/html; charset=utf-8", st->landing ? st->landing() : "");
    return 200;
  }
  send(conn, 404, "Not Found", "text/plain; charset=utf-8", "404 page not found\n");
  return 404;
}

void end_request(const mg_connection*, int) { release_slot(); }

int accept_any_certificate(int, X509_STORE_CTX*) { return 1; }

// civetweb hands over its TLS context; everything is set here from tls_server_config.
// Returning 1 tells civetweb the context is complete.
int init_ssl(void* ssl_ctx, void*) {
  const auto st = current_state();
  if (!st || !st->settings.security.tls) return -1;
  const TlsServerConfig& tls = *st->settings.security.tls;
  auto* ctx = static_cast<SSL_CTX*>(ssl_ctx);
  if (SSL_CTX_use_certificate_chain_file(ctx, tls.cert_file.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return -1;
  }
  SSL_CTX_set_min_proto_version(ctx, tls.min_version);
  SSL_CTX_set_max_proto_version(ctx, tls.max_version);
  switch (tls.client_auth) {
    case ClientAuth::NoClientCert:
      SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
      break;
    case ClientAuth::RequestClientCert:
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, accept_any_certificate);
      break;
    case ClientAuth::RequireAnyClientCert:
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         accept_any_certificate);
      break;
    case ClientAuth::VerifyClientCertIfGiven:
    case ClientAuth::RequireAndVerifyClientCert: {
      if (SSL_CTX_load_verify_locations(ctx, tls.client_ca_file.c_str(), nullptr) != 1) return -1;
      STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca_file.c_str());
      if (names) SSL_CTX_set_client_CA_list(ctx, names);
      int mode = SSL_VERIFY_PEER;
      if (tls.client_auth == ClientAuth::RequireAndVerifyClientCert) {
        mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
      }
      SSL_CTX_set_verify(ctx, mode, nullptr);
      break;
    }
  }
  return 1;
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

WebServer::WebServer(WebSettings settings, std::shared_ptr<prometheus::Collectable> metrics,
                     std::function<std::string()> landing_html)
    : settings_(std::move(settings)), metrics_(std::move(metrics)) {
  static CivetCallbacks callbacks = [] {
    CivetCallbacks cb;
    std::memset(static_cast<void*>(&cb), 0, sizeof cb);
    cb.begin_request = begin_request;
    cb.end_request = end_request;
    cb.init_ssl = init_ssl;
    return cb;
  }();
  const bool tls = settings_.security.tls.has_value();
  std::vector<std::string> options = {
      "listening_ports",
      civetweb_listen_spec(settings_.listen_address) + (tls ? "s" : ""),
      // Room for max_requests scrapes plus clients that are still sending their request:
      // a stalled client holds a worker only until request_timeout.
      "num_threads",
      std::to_string(settings_.max_requests + 4),
      "request_timeout_ms",
      std::to_string(settings_.request_timeout.count()),
  };
  auto state = std::make_shared<ServerState>();
  state->landing = std::move(landing_html);
  state->settings = settings_;
  {
    std::lock_guard lock(g_state_mutex);
    if (g_state) throw std::logic_error("a web server is already running");
    g_state = state;
  }
  if (!settings_.security.basic_auth_users.empty()) (void)decoy_hash();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options, &callbacks);
  } catch (const std::exception& e) {
    std::lock_guard lock(g_state_mutex);
    g_state.reset();
    throw std::runtime_error("cannot listen on " + settings_.listen_address +
                             (tls ? " with TLS" : "") + ": " + e.what());
  }
  exposer_->RegisterCollectable(metrics_, "/metrics");
}

WebServer::~WebServer() {
  exposer_.reset();
  std::lock_guard lock(g_state_mutex);
  g_state.reset();
}

std::vector<int> WebServer::ports() const { return exposer_->GetListeningPorts(); }

}  // namespace ebpf_metricsd
