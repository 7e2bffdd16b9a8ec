#pragma once
// The server side of TLS on GnuTLS: a certificate, its key and the client certificate policy
// of a tls_server_config, loaded once and shared by every connection that starts while it is
// current (a reload swaps in a new one; connections keep theirs until they end).

#include <gnutls/gnutls.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "ebpf_metricsd/http/web_config.h"

namespace ebpf_metricsd {

// A tls_server_config that cannot be used, with the key at fault.
class TlsSetupError : public std::runtime_error {
 public:
  TlsSetupError(std::string key, const std::string& what)
      : std::runtime_error(what), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

class TlsCredentials {
 public:
  // Reads and checks the certificate chain, the key (it must belong to the certificate) and
  // the client CAs. Throws TlsSetupError.
  static std::shared_ptr<const TlsCredentials> load(const TlsServerConfig& config);
  ~TlsCredentials();
  TlsCredentials(const TlsCredentials&) = delete;
  TlsCredentials& operator=(const TlsCredentials&) = delete;

  // Puts these credentials and the client certificate policy on a server session before
  // its handshake. A verifying policy fails the handshake of a client whose certificate does
  // not chain to a client CA; a requiring one that of a client without a certificate.
  void apply(gnutls_session_t session) const;

  // The GnuTLS priority string for the configured protocol versions.
  const std::string& priorities() const { return priorities_; }

 private:
  TlsCredentials() = default;
  gnutls_certificate_credentials_t credentials_ = nullptr;
  ClientAuth client_auth_ = ClientAuth::NoClientCert;
  std::string priorities_;
};

}  // namespace ebpf_metricsd
