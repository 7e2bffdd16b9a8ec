#include "ebpf_metricsd/web_config.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <memory>

#include "ebpf_metricsd/config_error.h"
#include "ebpf_metricsd/yaml_reader.h"

namespace ebpf_metricsd {

namespace {

std::optional<ClientAuth> parse_client_auth(const std::string& s) {
  if (s == "NoClientCert") return ClientAuth::NoClientCert;
  if (s == "RequestClientCert") return ClientAuth::RequestClientCert;
  if (s == "RequireAnyClientCert") return ClientAuth::RequireAnyClientCert;
  if (s == "VerifyClientCertIfGiven") return ClientAuth::VerifyClientCertIfGiven;
  if (s == "RequireAndVerifyClientCert") return ClientAuth::RequireAndVerifyClientCert;
  return std::nullopt;
}

std::optional<int> parse_tls_version(const std::string& s) {
  if (s == "TLS10") return TLS1_VERSION;
  if (s == "TLS11") return TLS1_1_VERSION;
  if (s == "TLS12") return TLS1_2_VERSION;
  if (s == "TLS13") return TLS1_3_VERSION;
  return std::nullopt;
}

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

bool is_bcrypt_hash(const std::string& h) {
  return h.size() == 60 && h[0] == '$' && h[1] == '2' &&
         (h[2] == 'a' || h[2] == 'b' || h[2] == 'y') && h[3] == '$';
}

TlsServerConfig read_tls(YamlMapReader& r) {
  TlsServerConfig tls;
  tls.cert_file = r.get_string("cert_file", "");
  tls.key_file = r.get_string("key_file", "");
  if (tls.cert_file.empty()) r.fail("cert_file", "required when tls_server_config is given");
  if (tls.key_file.empty()) r.fail("key_file", "required when tls_server_config is given");
  const std::string auth = r.get_string("client_auth_type", "NoClientCert");
  const auto a = parse_client_auth(auth);
  if (!a) {
    r.fail("client_auth_type",
           "expected NoClientCert, RequestClientCert, RequireAnyClientCert, "
           "VerifyClientCertIfGiven or RequireAndVerifyClientCert, got '" +
               auth + "'");
  }
  tls.client_auth = *a;
  tls.client_ca_file = r.get_string("client_ca_file", "");
  const bool verifies = tls.client_auth == ClientAuth::VerifyClientCertIfGiven ||
                        tls.client_auth == ClientAuth::RequireAndVerifyClientCert;
  if (verifies && tls.client_ca_file.empty()) {
    r.fail("client_ca_file", "required with client_auth_type " + auth);
  }
  if (!verifies && !tls.client_ca_file.empty()) {
    r.fail("client_ca_file",
           "client CAs are given but client_auth_type " + auth + " does not verify clients");
  }
  for (const char* key : {"min_version", "max_version"}) {
    const std::string v = r.get_string(key, "");
    if (v.empty()) continue;
    const auto parsed = parse_tls_version(v);
    if (!parsed) r.fail(key, "expected TLS10, TLS11, TLS12 or TLS13, got '" + v + "'");
    (std::string(key) == "min_version" ? tls.min_version : tls.max_version) = *parsed;
  }
  if (tls.min_version == 0) tls.min_version = TLS1_2_VERSION;
  if (tls.max_version != 0 && tls.max_version < tls.min_version) {
    r.fail("max_version", "is below min_version");
  }

  // Set everything up once now, so a wrong path or a key that does not belong to the
  // certificate is a configuration error and not a failed handshake later.
  try {
    (void)make_tls_context(tls);
  } catch (const TlsSetupError& e) {
    r.fail(e.key(), e.what());
  }
  return tls;
}

int accept_any_certificate(int, X509_STORE_CTX*) { return 1; }

}  // namespace

std::shared_ptr<ssl_ctx_st> make_tls_context(const TlsServerConfig& tls) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) throw TlsSetupError("", "cannot create a TLS context: " + openssl_error());
  SSL_CTX* c = ctx.get();
  if (SSL_CTX_use_certificate_chain_file(c, tls.cert_file.c_str()) != 1) {
    throw TlsSetupError("cert_file",
                        "cannot load certificate " + tls.cert_file + ": " + openssl_error());
  }
  if (SSL_CTX_use_PrivateKey_file(c, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    throw TlsSetupError("key_file",
                        "cannot load private key " + tls.key_file + ": " + openssl_error());
  }
  if (SSL_CTX_check_private_key(c) != 1) {
    throw TlsSetupError("key_file",
                        "the private key does not match the certificate: " + openssl_error());
  }
  SSL_CTX_set_min_proto_version(c, tls.min_version);
  SSL_CTX_set_max_proto_version(c, tls.max_version);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
  switch (tls.client_auth) {
    case ClientAuth::NoClientCert:
      SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
      break;
    case ClientAuth::RequestClientCert:
      SSL_CTX_set_verify(c, SSL_VERIFY_PEER, accept_any_certificate);
      break;
    case ClientAuth::RequireAnyClientCert:
      SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         accept_any_certificate);
      break;
    case ClientAuth::VerifyClientCertIfGiven:
    case ClientAuth::RequireAndVerifyClientCert: {
      if (SSL_CTX_load_verify_locations(c, tls.client_ca_file.c_str(), nullptr) != 1) {
        throw TlsSetupError("client_ca_file", "cannot load CA certificates " + tls.client_ca_file +
                                                  ": " + openssl_error());
      }
      if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca_file.c_str())) {
        SSL_CTX_set_client_CA_list(c, names);
      }
      int mode = SSL_VERIFY_PEER;
      if (tls.client_auth == ClientAuth::RequireAndVerifyClientCert) {
        mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
      }
      SSL_CTX_set_verify(c, mode, nullptr);
      break;
    }
  }
  return ctx;
}

WebConfig parse_web_config(const std::string& yaml_text, const std::string& file_name) {
  WebConfig cfg;
  cfg.file = file_name;
  cfg.text = yaml_text;
  YamlMapReader top(parse_yaml(yaml_text, file_name), file_name, "");
  if (top.has("tls_server_config")) {
    YamlMapReader tls = top.get_map("tls_server_config");
    cfg.tls = read_tls(tls);
    tls.finish();
  }
  YamlMapReader users = top.get_map("basic_auth_users");
  for (const auto& user : users.keys()) {
    const std::string hash = users.get_string(user, "");
    if (!is_bcrypt_hash(hash)) {
      users.fail(user, "expected a bcrypt hash ($2y$..., 60 characters, e.g. from htpasswd -nB)");
    }
    if (user.find(':') != std::string::npos) users.fail_key(user, "user names cannot contain ':'");
    cfg.basic_auth_users[user] = hash;
  }
  users.finish();
  top.finish();
  return cfg;
}

WebConfig load_web_config(const std::string& path) {
  return parse_web_config(read_config_file(path), path);
}

std::string bcrypt_hash(const std::string& password, unsigned long cost, const char* prefix) {
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  if (!crypt_gensalt_rn(prefix, cost, nullptr, 0, setting, sizeof setting)) return {};
  auto data = std::make_unique<crypt_data>();
  const char* out = crypt_r(password.c_str(), setting, data.get());
  return out && out[0] != '*' ? std::string(out) : std::string();
}

bool bcrypt_matches(const std::string& password, const std::string& hash) {
  if (!is_bcrypt_hash(hash)) return false;
  auto data = std::make_unique<crypt_data>();
  const char* out = crypt_r(password.c_str(), hash.c_str(), data.get());
  if (out == nullptr || out[0] == '*') return false;
  const std::string computed(out);
  return computed.size() == hash.size() &&
         CRYPTO_memcmp(computed.data(), hash.data(), hash.size()) == 0;
}

}  // namespace ebpf_metricsd
