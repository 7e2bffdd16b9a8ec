#pragma once
// --web.config.file: the web configuration format of the Prometheus exporters
// (exporter-toolkit): TLS and basic authentication.

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace ebpf_metricsd {

enum class ClientAuth {
  NoClientCert,
  RequestClientCert,
  RequireAnyClientCert,
  VerifyClientCertIfGiven,
  RequireAndVerifyClientCert,
};

struct TlsServerConfig {
  std::string cert_file;
  std::string key_file;
  ClientAuth client_auth = ClientAuth::NoClientCert;
  std::string client_ca_file;
  int min_version = 0;  // OpenSSL protocol version constant (TLS1_2_VERSION by default)
  int max_version = 0;  // 0 = the highest the library offers
};

struct WebConfig {
  std::string file;  // "" when none was given
  std::optional<TlsServerConfig> tls;
  std::map<std::string, std::string> basic_auth_users;  // user -> bcrypt hash
  // The file's bytes, so a reload restarts the server only when something changed.
  std::string text;
};

// Parses and validates (unknown keys, bad values, unreadable or mismatched certificate and
// key files are errors); throws ConfigError naming file:line:column and the key.
WebConfig parse_web_config(const std::string& yaml_text, const std::string& file_name);
WebConfig load_web_config(const std::string& path);

// A TLS context that is not usable, with the tls_server_config key at fault.
class TlsSetupError : public std::runtime_error {
 public:
  TlsSetupError(std::string key, const std::string& what)
      : std::runtime_error(what), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// The server's TLS context from tls_server_config: certificate chain and key, protocol
// versions, client certificate policy and CAs. Throws TlsSetupError.
std::shared_ptr<ssl_ctx_st> make_tls_context(const TlsServerConfig& tls);

// A bcrypt hash of `password` with a fresh salt ("" if the system cannot make one); `prefix`
// "$2b$" or "$2y$" (htpasswd's).
std::string bcrypt_hash(const std::string& password, unsigned long cost,
                        const char* prefix = "$2b$");

// Checks a password against a bcrypt hash ($2a$, $2b$, $2y$) in constant time.
bool bcrypt_matches(const std::string& password, const std::string& hash);

}  // namespace ebpf_metricsd
