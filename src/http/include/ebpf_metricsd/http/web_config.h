#pragma once
// --web.config.file: the web configuration format of the Prometheus exporters
// (exporter-toolkit): TLS and basic authentication.

#include <map>
#include <optional>
#include <string>

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
  // TLS versions as 10, 11, 12, 13 (TLS10..TLS13); max 0 = the highest the library offers.
  int min_version = 12;
  int max_version = 0;
  bool operator==(const TlsServerConfig&) const = default;
};

struct WebConfig {
  std::string file;  // "" when none was given
  std::optional<TlsServerConfig> tls;
  std::map<std::string, std::string> basic_auth_users;  // user -> bcrypt hash
  // The file's bytes, so a reload restarts the server only when something changed.
  std::string text;
  bool operator==(const WebConfig&) const = default;
};

// Parses and validates (unknown keys, bad values, unreadable or mismatched certificate and
// key files are errors); throws ConfigError naming file:line:column and the key.
WebConfig parse_web_config(const std::string& yaml_text, const std::string& file_name);
WebConfig load_web_config(const std::string& path);

}  // namespace ebpf_metricsd
