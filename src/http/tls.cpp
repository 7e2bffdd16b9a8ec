#include "ebpf_metricsd/http/tls.h"

#include <gnutls/x509.h>

#include <fstream>
#include <sstream>

namespace ebpf_metricsd {

namespace {

// Certificate and key files are small; anything larger is not one.
constexpr std::size_t kMaxPemBytes = 1 << 20;

std::string read_pem(const std::string& path, const std::string& key, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TlsSetupError(key, "cannot load " + what + " " + path + ": cannot open the file");
  std::string text(kMaxPemBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxPemBytes) {
    throw TlsSetupError(key, "cannot load " + what + " " + path + ": larger than 1 MiB");
  }
  return text;
}

gnutls_datum_t datum(const std::string& s) {
  return {reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
          static_cast<unsigned>(s.size())};
}

std::string version_name(int v) { return v == 10 ? "TLS1.0" : "TLS1." + std::to_string(v - 10); }

// "NORMAL" with only the versions from min to max (0: the newest, 1.3).
std::string priorities_for(int min_version, int max_version) {
  std::string p = "NORMAL:-VERS-ALL";
  for (int v = min_version; v <= (max_version == 0 ? 13 : max_version); ++v) {
    p += ":+VERS-" + version_name(v);
  }
  return p;
}

// Fails the handshake (non-zero) when the client's certificate does not verify against the
// client CAs. A client without one passes here; GNUTLS_CERT_REQUIRE refuses it on its own.
int verify_client(gnutls_session_t session) {
  unsigned int listed = 0;
  if (gnutls_certificate_get_peers(session, &listed) == nullptr || listed == 0) return 0;
  // As Go's crypto/tls does for exporter-toolkit: the chain must verify, and a certificate
  // with extended key usages must have clientAuth among them.
  gnutls_typed_vdata_st purpose{};
  purpose.type = GNUTLS_DT_KEY_PURPOSE_OID;
  purpose.data = reinterpret_cast<unsigned char*>(const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT));
  unsigned int status = 0;
  if (gnutls_certificate_verify_peers(session, &purpose, 1, &status) < 0) return -1;
  return status == 0 ? 0 : -1;
}

}  // namespace

std::shared_ptr<const TlsCredentials> TlsCredentials::load(const TlsServerConfig& config) {
  std::shared_ptr<TlsCredentials> c(new TlsCredentials());
  c->client_auth_ = config.client_auth;
  c->priorities_ = priorities_for(config.min_version, config.max_version);
  const std::string cert_pem = read_pem(config.cert_file, "cert_file", "certificate");
  const std::string key_pem = read_pem(config.key_file, "key_file", "private key");

  // Each file on its own first, so that an error names the file at fault.
  gnutls_x509_crt_t* chain = nullptr;
  unsigned int chain_size = 0;
  const gnutls_datum_t cert = datum(cert_pem), key = datum(key_pem);
  int err = gnutls_x509_crt_list_import2(&chain, &chain_size, &cert, GNUTLS_X509_FMT_PEM,
                                         GNUTLS_X509_CRT_LIST_FAIL_IF_UNSORTED);
  if (err < 0) {
    throw TlsSetupError(
        "cert_file", "cannot load certificate " + config.cert_file + ": " + gnutls_strerror(err));
  }
  for (unsigned int i = 0; i < chain_size; ++i) gnutls_x509_crt_deinit(chain[i]);
  gnutls_free(chain);
  gnutls_x509_privkey_t parsed_key = nullptr;
  gnutls_x509_privkey_init(&parsed_key);
  err = gnutls_x509_privkey_import2(parsed_key, &key, GNUTLS_X509_FMT_PEM, nullptr, 0);
  gnutls_x509_privkey_deinit(parsed_key);
  if (err < 0) {
    throw TlsSetupError("key_file",
                        "cannot load private key " + config.key_file + ": " + gnutls_strerror(err));
  }

  if ((err = gnutls_certificate_allocate_credentials(&c->credentials_)) < 0) {
    throw TlsSetupError("", std::string("cannot create TLS credentials: ") + gnutls_strerror(err));
  }
  err = gnutls_certificate_set_x509_key_mem2(c->credentials_, &cert, &key, GNUTLS_X509_FMT_PEM,
                                             nullptr, 0);
  if (err == GNUTLS_E_CERTIFICATE_KEY_MISMATCH) {
    throw TlsSetupError("key_file", "key mismatch: the private key in " + config.key_file +
                                        " does not belong to the certificate in " +
                                        config.cert_file);
  }
  if (err < 0) {
    throw TlsSetupError("cert_file", "cannot use certificate " + config.cert_file + " with key " +
                                         config.key_file + ": " + gnutls_strerror(err));
  }
  if (config.client_auth == ClientAuth::VerifyClientCertIfGiven ||
      config.client_auth == ClientAuth::RequireAndVerifyClientCert) {
    const int cas = gnutls_certificate_set_x509_trust_file(
        c->credentials_, config.client_ca_file.c_str(), GNUTLS_X509_FMT_PEM);
    if (cas <= 0) {
      throw TlsSetupError("client_ca_file",
                          "cannot load CA certificates " + config.client_ca_file + ": " +
                              (cas == 0 ? "no certificate in the file" : gnutls_strerror(cas)));
    }
    gnutls_certificate_set_verify_function(c->credentials_, verify_client);
  }
  // Checked now, so that a version range GnuTLS refuses is a configuration error.
  gnutls_priority_t prio = nullptr;
  const char* at = nullptr;
  if ((err = gnutls_priority_init(&prio, c->priorities_.c_str(), &at)) < 0) {
    throw TlsSetupError(config.max_version != 0 ? "max_version" : "min_version",
                        "unusable TLS versions " + c->priorities_ + ": " + gnutls_strerror(err));
  }
  gnutls_priority_deinit(prio);
  return c;
}

TlsCredentials::~TlsCredentials() {
  if (credentials_) gnutls_certificate_free_credentials(credentials_);
}

void TlsCredentials::apply(gnutls_session_t session) const {
  gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, credentials_);
  switch (client_auth_) {
    case ClientAuth::NoClientCert:
      gnutls_certificate_server_set_request(session, GNUTLS_CERT_IGNORE);
      break;
    case ClientAuth::RequestClientCert:
    case ClientAuth::VerifyClientCertIfGiven:
      gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUEST);
      break;
    case ClientAuth::RequireAnyClientCert:
    case ClientAuth::RequireAndVerifyClientCert:
      gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
      break;
  }
}

}  // namespace ebpf_metricsd
