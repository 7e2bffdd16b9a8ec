#include "ebpf_metricsd/http/web_config.h"

#include "ebpf_metricsd/base/config_error.h"
#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/http/basic_auth.h"
#include "ebpf_metricsd/http/tls.h"

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
  if (s == "TLS10") return 10;
  if (s == "TLS11") return 11;
  if (s == "TLS12") return 12;
  if (s == "TLS13") return 13;
  return std::nullopt;
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
           "VerifyClientCertIfGiven or RequireAndVerifyClientCert, got " +
               quoted_excerpt(auth));
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
    if (!parsed) r.fail(key, "expected TLS10, TLS11, TLS12 or TLS13, got " + quoted_excerpt(v));
    (std::string(key) == "min_version" ? tls.min_version : tls.max_version) = *parsed;
  }
  if (tls.max_version != 0 && tls.max_version < tls.min_version) {
    r.fail("max_version", "is below min_version");
  }

  // Set everything up once now, so a wrong path or a key that does not belong to the
  // certificate is a configuration error and not a failed handshake later.
  try {
    (void)TlsCredentials::load(tls);
  } catch (const TlsSetupError& e) {
    r.fail(e.key(), e.what());
  }
  return tls;
}

}  // namespace

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

}  // namespace ebpf_metricsd
