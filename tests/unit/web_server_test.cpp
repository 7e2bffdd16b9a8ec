// The web server in process: basic auth, TLS with client certificates, the scrape limit and
// slow clients. TLS clients are curl; certificates are made by the openssl command.

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <random>

#include "../test_support.h"
#include "ebpf_metricsd/base/config_error.h"
#include "ebpf_metricsd/daemon/exposition.h"
#include "ebpf_metricsd/http/basic_auth.h"
#include "ebpf_metricsd/http/request_grammar.h"
#include "ebpf_metricsd/http/server.h"
#include "ebpf_metricsd/http/web_config.h"

using namespace ebpf_metricsd;
using namespace ebpf_metricsd::test;
using namespace std::chrono_literals;

namespace {

// One gauge; rendering can be held until released, to keep scrapes in flight.
class GateCollectable {
 public:
  std::string render(ExpositionFormat) const {
    std::unique_lock lock(mutex_);
    ++entered_;
    entered_cv_.notify_all();
    open_cv_.wait(lock, [this] { return open_; });
    return "# HELP test_gauge A gauge.\n# TYPE test_gauge gauge\ntest_gauge 42\n";
  }
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    open_cv_.notify_all();
  }
  bool wait_entered(int n) {
    std::unique_lock lock(mutex_);
    return entered_cv_.wait_for(lock, 5s, [&] { return entered_ >= n; });
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable open_cv_, entered_cv_;
  mutable int entered_ = 0;
  bool open_ = true;
};

MetricsRenderer renderer(const std::shared_ptr<GateCollectable>& metrics) {
  return [metrics](ExpositionFormat f) { return metrics->render(f); };
}

// htpasswd-style ($2y$), cheap to make.
std::string test_hash(const std::string& password) {
  std::string h = bcrypt_hash(password, 5, "$2y$");
  REQUIRE_FALSE(h.empty());
  return h;
}

std::string basic(const std::string& user, const std::string& password) {
  return "Authorization: Basic " + base64(user + ":" + password) + "\r\n";
}

WebSettings local(int port) {
  WebSettings s;
  s.listen_address = "127.0.0.1:" + std::to_string(port);
  return s;
}

// A CA, a server certificate for 127.0.0.1 and client certificates from that CA and from a
// stranger's CA.
struct Pki {
  std::string dir = temp_dir();
  Pki() {
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    std::ofstream(dir + "/san.ext") << "subjectAltName=IP:127.0.0.1\n";
    const std::string script =
        "set -e; cd " + dir + "; exec 2>openssl.log\n" + "openssl req -x509 " + key +
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca\n" + "openssl req -x509 " + key +
        " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca\n" + "openssl req " +
        key + " -keyout server.key -out server.csr -subj /CN=127.0.0.1\n" +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-extfile san.ext -days 2 -out server.pem\n" +
        "openssl req " + key + " -keyout client.key -out client.csr -subj /CN=scraper\n" +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-out client.pem\n" +
        "openssl req " + key + " -keyout rogue.key -out rogue.csr -subj /CN=rogue\n" +
        "openssl x509 -req -in server.csr -CA other-ca.pem -CAkey other-ca.key "
        "-CAcreateserial -extfile san.ext -days 2 -out server-other-ca.pem\n" +
        "openssl x509 -req -in rogue.csr -CA other-ca.pem -CAkey other-ca.key "
        "-CAcreateserial -days 2 -out rogue.pem\n" +
        // Of the right CA, but for servers only (extended key usage serverAuth).
        "openssl req " + key + " -keyout serveronly.key -out serveronly.csr -subj /CN=web\n" +
        "echo extendedKeyUsage=serverAuth > eku.ext\n"
        "openssl x509 -req -in serveronly.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-extfile eku.ext -days 2 -out serveronly.pem\n";
    REQUIRE(run_command("sh -c '" + script + "' ") == 0);
  }
  ~Pki() { std::filesystem::remove_all(dir); }
};

// A TLS server from a web config whose tls_server_config gets `tls_extra` (indented keys,
// "{pki}" standing for the certificates' directory) and which ends with `rest`; curl
// arguments for it.
struct TlsServer {
  Pki pki;
  std::shared_ptr<GateCollectable> metrics = std::make_shared<GateCollectable>();
  int port = free_port();
  std::unique_ptr<WebServer> server;
  std::string url = " https://127.0.0.1:" + std::to_string(port) + "/metrics";
  std::string ca = " --cacert " + pki.dir + "/ca.pem";

  TlsServer(std::string tls_extra, const std::string& rest) {
    for (std::size_t p; (p = tls_extra.find("{pki}")) != std::string::npos;) {
      tls_extra.replace(p, 5, pki.dir);
    }
    WebSettings s = local(port);
    s.security = parse_web_config("tls_server_config:\n  cert_file: " + pki.dir +
                                      "/server.pem\n  key_file: " + pki.dir + "/server.key\n" +
                                      tls_extra + rest,
                                  "web.yml");
    server = std::make_unique<WebServer>(
        s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  }
  std::string client(const std::string& name) const {
    return " --cert " + pki.dir + "/" + name + ".pem --key " + pki.dir + "/" + name + ".key";
  }
};

// curl's HTTP status, or "000" when no response came (handshake refused).
std::string curl_status(const std::string& args) {
  return run_capture("curl -s -o /dev/null -w '%{http_code}' --max-time 5 " + args);
}

}  // namespace

TEST_CASE("basic auth: no credentials and wrong password get 401, the right one 200") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.security.basic_auth_users["prometheus"] = test_hash("s3cret:with colon");
  WebServer server(
      s, exporter_routes(renderer(metrics), [] { return std::string("<html>landing</html>"); }));

  const auto none = http_get(port, "/metrics");
  CHECK(none.status == 401);
  CHECK_THAT(none.headers, Catch::Matchers::Contains("WWW-Authenticate: Basic"));
  CHECK(http_get(port, "/", "").status == 401);  // every path, not only /metrics
  CHECK(http_get(port, "/metrics", basic("prometheus", "wrong")).status == 401);
  CHECK(http_get(port, "/metrics", basic("nobody", "s3cret:with colon")).status == 401);
  CHECK(http_get(port, "/metrics", "Authorization: Basic !!notbase64\r\n").status == 401);
  CHECK(http_get(port, "/metrics", "Authorization: Bearer abc\r\n").status == 401);
  CHECK(http_get(port, "/metrics", "Authorization: Basic ====\r\n").status == 401);
  CHECK(http_get(port, "/metrics", basic("prometheus", std::string("s3cret:with colon\0junk", 22)))
            .status == 401);
  for (int i = 0; i < 2; ++i) {  // the second time from the verified-password cache
    const auto ok = http_get(port, "/metrics", basic("prometheus", "s3cret:with colon"));
    CHECK(ok.status == 200);
    CHECK_THAT(ok.body, Catch::Matchers::Contains("test_gauge 42"));
  }
  CHECK(http_get(port, "/metrics", basic("prometheus", "s3cret:with colo")).status == 401);
  CHECK(http_get(port, "/", basic("prometheus", "s3cret:with colon")).status == 200);
}

TEST_CASE("scrapes past max_requests get 503 at once, and the slot frees again") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.max_requests = 1;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));

  metrics->close();
  auto held = std::async(std::launch::async, [&] { return http_get(port, "/metrics"); });
  REQUIRE(metrics->wait_entered(1));
  const auto t0 = std::chrono::steady_clock::now();
  const auto rejected = http_get(port, "/metrics");
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(rejected.status == 503);
  CHECK(waited < 2s);                        // answered while the first scrape is still held
  CHECK(http_get(port, "/").status == 200);  // the limit is on scrapes only
  metrics->open();
  CHECK(held.get().status == 200);
  CHECK(http_get(port, "/metrics").status == 200);
}

TEST_CASE("a client dripping its request does not delay a scrape and is cut off") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.max_requests = 1;
  s.request_timeout = 1500ms;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));

  // Three slow clients, each sending one byte of its request header every 700 ms.
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  std::vector<std::future<std::chrono::milliseconds>> slow;
  for (int c = 0; c < 3; ++c) {
    slow.push_back(std::async(std::launch::async, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      const int fd = connect_loopback(port);
      if (fd < 0) return -1ms;
      for (char ch : request) {
        if (send(fd, &ch, 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(700ms);
        char probe;
        if (recv(fd, &probe, 1, MSG_DONTWAIT) == 0) break;  // the server hung up
      }
      close(fd);
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
    }));
  }
  std::this_thread::sleep_for(1s);  // the slow clients hold their connections
  for (int i = 0; i < 3; ++i) {
    const auto r = http_get(port, "/metrics");
    CHECK(r.status == 200);
  }
  for (auto& f : slow) {
    const auto lasted = f.get();
    INFO("slow client connected for " << lasted.count() << " ms");
    // Sending the whole request would take 30 s; the server hangs up after its timeout.
    CHECK(lasted > 0ms);
    CHECK(lasted < 10s);
  }
}

TEST_CASE("TLS with RequireAndVerifyClientCert: only clients with a certificate of the CA") {
  TlsServer t(
      "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki}/ca.pem\n"
      "  min_version: TLS12\n",
      "");
  CHECK(curl_status(t.ca + t.client("client") + t.url) == "200");
  CHECK(curl_status(t.ca + t.url) == "000");  // no client certificate: handshake refused
  CHECK(curl_status(t.ca + t.client("rogue") + t.url) == "000");  // another CA's
  // The CA's, but not for client authentication.
  CHECK(curl_status(t.ca + t.client("serveronly") + t.url) == "000");
  // Plain HTTP on the TLS port gets no metrics.
  CHECK(http_get(t.port, "/metrics").status != 200);
  // TLS 1.1 is below min_version (curl is told to allow it: it refuses it by default).
  const std::string tls11 = " --tls-max 1.1 --ciphers DEFAULT@SECLEVEL=0";
  CHECK(curl_status(t.ca + tls11 + t.client("client") + t.url) == "000");
  CHECK(curl_status(t.ca + " --tls-max 1.2" + t.client("client") + t.url) == "200");
}

TEST_CASE("TLS: min_version TLS11 lets a TLS 1.1 client in, max_version TLS12 keeps 1.3 out") {
  TlsServer t("  min_version: TLS11\n  max_version: TLS12\n", "");
  CHECK(curl_status(t.ca + " --tls-max 1.1 --ciphers DEFAULT@SECLEVEL=0" + t.url) == "200");
  CHECK(curl_status(t.ca + " --tlsv1.3" + t.url) == "000");
  CHECK(curl_status(t.ca + " --tlsv1.2" + t.url) == "200");
}

TEST_CASE("TLS: the other client_auth_types behave as exporter-toolkit's") {
  SECTION("RequestClientCert: any certificate or none") {
    TlsServer t("  client_auth_type: RequestClientCert\n", "");
    CHECK(curl_status(t.ca + t.url) == "200");
    CHECK(curl_status(t.ca + t.client("rogue") + t.url) == "200");
  }
  SECTION("RequireAnyClientCert: any certificate, but one") {
    TlsServer t("  client_auth_type: RequireAnyClientCert\n", "");
    CHECK(curl_status(t.ca + t.url) == "000");
    CHECK(curl_status(t.ca + t.client("rogue") + t.url) == "200");
  }
  SECTION("VerifyClientCertIfGiven: none, or one of the CA") {
    TlsServer t("  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {pki}/ca.pem\n",
                "");
    CHECK(curl_status(t.ca + t.url) == "200");
    CHECK(curl_status(t.ca + t.client("client") + t.url) == "200");
    CHECK(curl_status(t.ca + t.client("rogue") + t.url) == "000");
    CHECK(curl_status(t.ca + t.client("serveronly") + t.url) == "000");
  }
}

TEST_CASE("TLS without client certificates, with basic auth on top") {
  TlsServer t("", "basic_auth_users:\n  alice: " + test_hash("pw") + "\n");
  CHECK(curl_status(t.ca + t.url) == "401");
  CHECK(curl_status(t.ca + " -u alice:nope" + t.url) == "401");
  CHECK(curl_status(t.ca + " -u alice:pw" + t.url) == "200");
}

TEST_CASE("reload_tls picks up certificate files replaced on disk") {
  TlsServer t("", "");
  const std::string other_ca = " --cacert " + t.pki.dir + "/other-ca.pem";
  CHECK(curl_status(t.ca + t.url) == "200");
  CHECK(curl_status(other_ca + t.url) == "000");
  // The same key, now certified by the other CA.
  std::filesystem::copy_file(t.pki.dir + "/server-other-ca.pem", t.pki.dir + "/server.pem",
                             std::filesystem::copy_options::overwrite_existing);
  CHECK(curl_status(t.ca + t.url) == "200");  // nothing changes until the reload
  t.server->reload_tls();
  CHECK(curl_status(other_ca + t.url) == "200");
  CHECK(curl_status(t.ca + t.url) == "000");
  // A broken file is refused and the loaded certificate stays.
  std::ofstream(t.pki.dir + "/server.pem") << "not a certificate\n";
  CHECK_THROWS_AS(t.server->reload_tls(), std::runtime_error);
  CHECK(curl_status(other_ca + t.url) == "200");
}

TEST_CASE("web config errors name the file, line and key") {
  Pki pki;
  auto err = [](const std::string& yaml) {
    try {
      parse_web_config(yaml, "web.yml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(err("tls_server_config:\n  cert_file: a\n  key_fil: b\n"),
             Contains("web.yml:") && Contains("tls_server_config.key_file"));
  CHECK_THAT(err("basic_auth_users:\n  bob: plaintext\n"),
             Contains("web.yml:2:8: basic_auth_users.bob: expected a bcrypt hash"));
  CHECK_THAT(err("http_server_config:\n  http2: true\n"),
             Contains("web.yml:1:1: http_server_config: unknown key"));
  CHECK_THAT(err("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /x.key\n"),
             Contains("web.yml:2:14: tls_server_config.cert_file: cannot load certificate"));
  // The key of another certificate.
  CHECK_THAT(err("tls_server_config:\n  cert_file: " + pki.dir +
                 "/server.pem\n  key_file: " + pki.dir + "/client.key\n"),
             Contains("web.yml:3:13: tls_server_config.key_file:") && Contains("mismatch"));
  CHECK_THAT(err("tls_server_config:\n  cert_file: " + pki.dir + "/server.pem\n  key_file: " +
                 pki.dir + "/server.key\n  client_auth_type: RequireAndVerifyClientCert\n"),
             Contains("client_ca_file: required"));
  CHECK_THAT(err("tls_server_config:\n  cert_file: " + pki.dir +
                 "/server.pem\n  key_file: " + pki.dir + "/server.key\n  min_version: SSL3\n"),
             Contains("min_version: expected TLS10"));
  CHECK(err("basic_auth_users:\n  bob: " + test_hash("x") + "\n") == "no error");
}

TEST_CASE("bcrypt hashes from htpasswd-style $2y$ and $2b$ verify") {
  const std::string h = test_hash("correct horse");
  CHECK(bcrypt_matches("correct horse", h));
  CHECK_FALSE(bcrypt_matches("correct hors", h));
  CHECK_FALSE(bcrypt_matches("correct horse", "$2y$05$tooshort"));
}

TEST_CASE("malformed and oversized requests get 4xx and the server serves on") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebServer server(local(port),
                   exporter_routes(renderer(metrics), [] { return std::string("<html></html>"); }));
  CHECK(http_get(port, "/" + std::string(100000, 'a')).status == 414);  // URI too long
  std::string many;
  for (int i = 0; i < 5000; ++i) many += "X-Filler: " + std::to_string(i) + "\r\n";
  CHECK(http_get(port, "/metrics", many).status == 431);
  CHECK(http_get(port, "no-slash").status == 400);
  CHECK(http_get(port, "/metrics", "no colon here\r\n").status == 400);
  CHECK(http_get(port, "/nope").status == 404);
  const auto gz = http_get(port, "/metrics", "Accept-Encoding: gzip\r\n");
  CHECK(gz.status == 200);
  CHECK_THAT(gz.headers, Catch::Matchers::Contains("Content-Encoding: gzip"));
  CHECK(http_get(port, "/metrics").body.find("test_gauge 42") != std::string::npos);
}

TEST_CASE("/-/healthy follows the health callback") {
  auto metrics = std::make_shared<GateCollectable>();
  std::atomic<bool> healthy{false};
  const int port = free_port();
  WebServer server(local(port), exporter_routes(
                                    renderer(metrics), [] { return std::string(); },
                                    [&] { return healthy.load(); }));
  CHECK(http_get(port, "/-/healthy").status == 503);
  healthy = true;
  CHECK(http_get(port, "/-/healthy").status == 200);
  const int other = free_port();
  WebServer without(local(other), exporter_routes(renderer(metrics), [] { return std::string(); }));
  CHECK(http_get(other, "/-/healthy").status == 200);
}

TEST_CASE("stopping the server does not wait for stalled clients") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.request_timeout = 60s;
  auto server = std::make_unique<WebServer>(
      s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  // A client that sends half a request and then nothing.
  const int fd = connect_loopback(port);
  REQUIRE(fd >= 0);
  REQUIRE(send(fd, "GET /met", 8, 0) == 8);
  std::this_thread::sleep_for(300ms);  // a worker is now waiting for the rest
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO("stopping took " << std::chrono::duration<double>(took).count() << " s");
  CHECK(took < 20s);  // far below the 60 s the client would be allowed
  char c;
  CHECK(recv(fd, &c, 1, 0) == 0);  // and the client sees the connection closed
  close(fd);
}

namespace {

// Whether `raw` begins with one whole response: its head and its Content-Length body.
bool whole_response(const std::string& raw) {
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  const auto cl = raw.find("Content-Length: ");
  const std::size_t body =
      cl == std::string::npos || cl > head_end ? 0 : std::stoul(raw.substr(cl + 16));
  return raw.size() >= head_end + 4 + body;
}

// One raw request on its own connection: everything the server sends until it closes, or
// until one whole response has come on a connection it keeps open.
std::string raw_exchange(int port, const std::string& request) {
  const int fd = connect_loopback(port, 5);
  if (fd < 0) return "";
  (void)send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) {
    out.append(buf, static_cast<std::size_t>(n));
    if (out.find("Connection: close") < out.find("\r\n\r\n")) continue;  // read to the close
    if (whole_response(out)) break;
  }
  close(fd);
  return out;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("requests outside the HTTP grammar get 400 (or 431) and Connection: close") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.request_timeout = 3s;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  std::string fields_101, fields_100;
  for (int i = 0; i < 101; ++i) fields_101 += "X-F" + std::to_string(i) + ": v\r\n";
  for (int i = 0; i < 98; ++i) fields_100 += "X-F" + std::to_string(i) + ": v\r\n";
  // 16 KiB of head exactly, in 90 fields; one byte more.
  std::string big;
  for (int i = 0; i < 89; ++i)
    big += "X-Big" + std::to_string(i) + ": " + std::string(150, 'b') + "\r\n";
  const std::size_t head_so_far = get.size() + big.size() + std::string("X-Last: \r\n\r\n").size();
  const std::string at_limit =
      get + big + "X-Last: " + std::string(16384 - head_so_far, 'l') + "\r\n\r\n";
  const std::string over_limit =
      get + big + "X-Last: " + std::string(16385 - head_so_far, 'l') + "\r\n\r\n";
  REQUIRE(at_limit.size() == 16384);
  struct Case {
    const char* what;
    std::string request;
    int status;
  };
  std::string params_64 = "/metrics?a=0", params_65;
  for (int i = 1; i < 64; ++i) params_64 += "&a=" + std::to_string(i);
  params_65 = params_64 + "&a=64";
  const std::vector<Case> cases = {
      {"64 query parameters", "GET " + params_64 + " HTTP/1.1\r\nHost: x\r\n\r\n", 200},
      {"65 query parameters", "GET " + params_65 + " HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"Transfer-Encoding chunked", get + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
      {"obfuscated Transfer-Encoding",
       get + "Transfer-Encoding: xchunked\r\nTransfer-Encoding : chunked\r\n\r\n", 400},
      {"two Content-Length", get + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nx", 400},
      {"Content-Length with a body", get + "Content-Length: 5\r\n\r\nhello", 400},
      {"Transfer-Encoding and Content-Length",
       get + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400},
      {"%00 in the path", "GET /metrics%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"raw NUL in the path", std::string("GET /metrics") + '\0' + "x HTTP/1.1\r\nHost: x\r\n\r\n",
       400},
      {"invalid percent-encoding", "GET /metrics%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"percent-encoded control", "GET /metrics%0a HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"control character in the path", "GET /metrics\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"non-ASCII byte in the path", "GET /metrics\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"empty header name", "GET /metrics HTTP/1.1\r\n: value\r\nHost: x\r\n\r\n", 400},
      {"empty header name, last", get + ": value\r\n\r\n", 400},
      {"folded header line", get + "Accept: text/plain\r\n  folded\r\n\r\n", 400},
      {"blanks around a value, an empty value",
       "GET /metrics HTTP/1.1\r\nHost:x\r\nX:  v \r\nY:\r\n\r\n", 200},
      {"bare LF line ends", "GET /metrics HTTP/1.1\nHost: x\n\n", 200},
      {"space in a header name", get + "Bad Name: v\r\n\r\n", 400},
      {"control character in a value",
       get + "X: a\x01"
             "b\r\n\r\n",
       400},
      {"two spaces after the method", "GET  /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"two spaces before the version", "GET /metrics  HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"no Host in HTTP/1.1", "GET /metrics HTTP/1.1\r\n\r\n", 400},
      {"two Host fields", get + "Host: y\r\n\r\n", 400},
      {"101 header fields", get + fields_101 + "\r\n", 431},
      {"100 header fields", get + fields_100 + "X-Last: v\r\n\r\n", 200},
      {"a 16 KiB head", at_limit, 200},
      {"a head one byte over 16 KiB", over_limit, 431},
      {"Content-Length: 0", get + "Content-Length: 0\r\n\r\n", 200},
      {"a 17 KiB request-target",
       "GET /" + std::string(17 * 1024, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", 414},
      {"percent-encoded letter", "GET /metr%69cs HTTP/1.1\r\nHost: x\r\n\r\n", 200},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    // Each answered while a good scrape on another connection succeeds.
    auto good = std::async(std::launch::async, [&] { return http_get(port, "/metrics").status; });
    const std::string answer = raw_exchange(port, c.request);
    INFO(answer.substr(0, 300));
    CHECK(answer.rfind("HTTP/1.1 " + std::to_string(c.status) + " ", 0) == 0);
    CHECK(count_of(answer, "\r\n\r\n") >= 1);
    CHECK(count_of(answer, "Date: ") == 1);  // one header block, never two
    if (c.status != 200) CHECK_THAT(answer, Catch::Matchers::Contains("Connection: close"));
    CHECK(good.get() == 200);
  }
}

TEST_CASE("heads libmicrohttpd refuses itself: 400 and close, or a close; the server serves on") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebServer server(local(port), exporter_routes(renderer(metrics), [] { return std::string(); }));
  for (const std::string length : {"-1", "abc", "99999999999999999999999"}) {
    INFO("Content-Length: " << length);
    // 0.9.75 writes the head of its own answer twice (README); the status and the close hold.
    const std::string answer = raw_exchange(
        port, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + "\r\n\r\n");
    CHECK(answer.rfind("HTTP/1.1 4", 0) == 0);
    CHECK_THAT(answer, Catch::Matchers::Contains("Connection: close"));
    CHECK(http_get(port, "/metrics").status == 200);
  }
  // Tabs for spaces in the request line: 0.9.75 closes without an answer; never a 200.
  const std::string tabs = raw_exchange(port, "GET\t/metrics\tHTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK((tabs.empty() || tabs.rfind("HTTP/1.1 400 ", 0) == 0));
  CHECK(http_get(port, "/metrics").status == 200);
  // Thousands of query parameters in a 15 KiB target: the library stores each in the
  // connection's memory pool before the head is whole and closes when the pool is full.
  std::string many = "/metrics?seconds=1";
  for (int i = 1; i < 1500; ++i) many += "&seconds=1";
  REQUIRE(many.size() < 16 * 1024);
  auto good = std::async(std::launch::async, [&] { return http_get(port, "/metrics").status; });
  const std::string flood = raw_exchange(port, "GET " + many + " HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK((flood.empty() || flood.rfind("HTTP/1.1 4", 0) == 0));
  CHECK(good.get() == 200);
  CHECK(http_get(port, "/metrics").status == 200);
}

TEST_CASE("list-valued header fields: tokens, parameters and weights") {
  const auto list = parse_header_list(
      " Application/OpenMetrics-Text; Version=\"1.0.0\" ;q=0.5,text/plain, gzip;q=x,,br;q=2");
  REQUIRE(list.size() == 4);
  CHECK(list[0].token == "application/openmetrics-text");
  CHECK(list[0].param("version") == "1.0.0");
  CHECK(list[0].q == 0.5);
  CHECK(list[0].params.size() == 1);  // q is a weight, not a parameter
  CHECK(list[1].token == "text/plain");
  CHECK(list[1].q == 1);
  CHECK(list[1].param("version").empty());
  CHECK(list[2].q == 0);  // a weight that is no number refuses the element
  CHECK(list[3].q == 0);  // so does one above 1
  CHECK(parse_header_list("").empty());
  CHECK(ascii_lower("GZip-\xC3\x84") == "gzip-\xC3\x84");
}

TEST_CASE("request grammar: targets and header fields") {
  CHECK_FALSE(check_request_target("/metrics?x=1&y=%2F"));
  CHECK(check_request_target("metrics")->status == 400);
  CHECK(check_request_target("/a%2")->status == 400);
  CHECK(check_request_target("/a%g0")->status == 400);
  CHECK(check_request_target("/a%7F")->status == 400);
  CHECK(check_request_target("/a%1f")->status == 400);
  CHECK(check_request_target(std::string_view("/a\0b", 4))->status == 400);
  std::string params = "/debug/pprof/profile?seconds=1";
  for (std::size_t i = 1; i < kMaxQueryParameters; ++i) params += "&seconds=1";
  CHECK_FALSE(check_request_target(params));
  CHECK(check_request_target(params + "&x")->status == 400);
  using Fields = std::vector<std::pair<std::string_view, std::string_view>>;
  CHECK_FALSE(check_header_fields(Fields{{"Host", "x"}, {"X-Tab", "a\tb"}}, "HTTP/1.1"));
  CHECK_FALSE(check_header_fields(Fields{}, "HTTP/1.0"));
  CHECK(check_header_fields(Fields{}, "HTTP/1.1")->status == 400);
  CHECK(check_header_fields(Fields{}, "HTTP/1.2")->status == 400);
  CHECK(check_header_fields(Fields{{"Host", "x"}, {"content-length", "00"}}, "HTTP/1.1")->status ==
        400);
  CHECK(check_header_fields(Fields{{"Host", "x"}, {"X", std::string_view("a\0b", 3)}}, "HTTP/1.1")
            ->status == 400);
}

TEST_CASE(
    "Two thousand mutated requests: each answered with a status or closed; the server serves on") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.request_timeout = 500ms;
  s.security.basic_auth_users["u"] = test_hash("p");
  WebServer server(s,
                   exporter_routes(renderer(metrics), [] { return std::string("<html></html>"); }));
  const std::string valid =
      "GET /metrics?x=1 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic dTpw\r\n"
      "Accept-Encoding: gzip, deflate\r\nConnection: close\r\n\r\n";
  std::mt19937 rng(20261122);
  int answered = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string req = valid;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % req.size();
      switch (rng() % 4) {
        case 0:
          req[pos] = static_cast<char>(rng());
          break;
        case 1:
          req.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          req.insert(pos, std::string(1 + rng() % 16, static_cast<char>(rng())));
          break;
        default:
          req.insert(pos, req.substr(rng() % req.size(), rng() % 32));
      }
      if (req.empty()) req = "\r\n\r\n";
    }
    if (req.find("\r\n\r\n") == std::string::npos) req += "\r\n\r\n";
    const int fd = connect_loopback(port, 2);
    REQUIRE(fd >= 0);
    (void)send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[16] = {};
    const ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    close(fd);
    if (n > 0) {
      INFO(req);
      CHECK(std::string(buf).rfind("HTTP/1.1 ", 0) == 0);
      ++answered;
    }
  }
  CHECK(answered > 1000);
  CHECK(http_get(port, "/metrics", "Authorization: Basic dTpw\r\n").status == 200);
}

namespace {

// A TCP connection to 127.0.0.1:port from the loopback address `source` (any of 127/8).
int connect_from(const char* source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  // Long enough that only a connection left waiting (never answered, never closed) reaches it.
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, source, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads one response (head and Content-Length body) from a kept-alive connection; its
// status, or 0 when the connection ended first.
int read_response(int fd) {
  std::string raw;
  char buf[4096];
  for (;;) {
    if (whole_response(raw)) return std::atoi(raw.c_str() + 9);
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return 0;
    raw.append(buf, static_cast<std::size_t>(n));
  }
}

}  // namespace

TEST_CASE("a kept-alive connection serves scrape after scrape, and is closed after idle_timeout") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.idle_timeout = 700ms;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  const int fd = connect_loopback(port, 5);
  REQUIRE(fd >= 0);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  for (int i = 0; i < 3; ++i) {
    REQUIRE(send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
    CHECK(read_response(fd) == 200);
  }
  // Idle past idle_timeout: the server hangs up (libmicrohttpd's own timer, a backstop,
  // would take 3 s).
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  CHECK(recv(fd, &c, 1, 0) == 0);
  const auto idle = std::chrono::steady_clock::now() - t0;
  CHECK(idle > 500ms);
  CHECK(idle < 1500ms);
  close(fd);
}

TEST_CASE("connections past the per-address limit are closed at once; other addresses are served") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.max_connections_per_address = 3;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_from("127.0.0.2", port));
  for (int fd : held) REQUIRE(fd >= 0);
  std::this_thread::sleep_for(200ms);
  const int extra = connect_from("127.0.0.2", port);
  REQUIRE(extra >= 0);  // accepted by the kernel, then closed by the server
  char c;
  CHECK(recv(extra, &c, 1, 0) == 0);
  close(extra);
  CHECK(http_get(port, "/metrics").status == 200);  // from 127.0.0.1
  close(held.back());
  held.pop_back();
  // A slot is free again once the server has seen that close: however long that takes on a
  // busy machine, a new connection from the address is then served.
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  int attempts = 0;
  const bool served = test::wait_until(
      [&] {
        ++attempts;
        const int again = connect_from("127.0.0.2", port);
        const bool ok = again >= 0 && send(again, req.data(), req.size(), MSG_NOSIGNAL) > 0 &&
                        read_response(again) == 200;
        if (again >= 0) close(again);
        return ok;
      },
      20s);
  INFO(attempts << " connections from 127.0.0.2 after one of the three closed");
  CHECK(served);
  for (int fd : held) close(fd);
}

TEST_CASE("connections past max_connections are closed at once, whichever event loop takes them") {
  auto metrics = std::make_shared<GateCollectable>();
  const int port = free_port();
  WebSettings s = local(port);
  s.max_connections = 6;
  s.max_connections_per_address = 6;
  WebServer server(s, exporter_routes(renderer(metrics), [] { return std::string(); }));
  std::vector<int> held;
  for (const char* from : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 2; ++i) held.push_back(connect_from(from, port));
  }
  for (int fd : held) REQUIRE(fd >= 0);
  std::this_thread::sleep_for(200ms);
  for (const char* from : {"127.0.0.5", "127.0.0.1"}) {
    const int extra = connect_from(from, port);
    REQUIRE(extra >= 0);
    const auto t0 = std::chrono::steady_clock::now();
    char c;
    const ssize_t got = recv(extra, &c, 1, 0);
    INFO("from " << from << ": recv " << got << " (errno " << errno << ") after "
                 << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                 << " s");
    CHECK(got == 0);  // closed, not left waiting in the backlog until the receive timeout
    close(extra);
  }
  close(held.back());
  held.pop_back();
  // A slot is free again once the server has seen that close.
  CHECK(test::wait_until([&] { return http_get(port, "/metrics").status == 200; }, 20s));
  for (int fd : held) close(fd);
}
