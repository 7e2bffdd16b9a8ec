#include <arpa/inet.h>

#include <stdexcept>

#include "ebpf_metricsd/base/yaml_reader.h"
#include "ebpf_metricsd/http/server.h"

namespace ebpf_metricsd {

namespace {

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
    out.error = "invalid port " + quoted_excerpt(out.port);
    return out;
  }
  if (out.host == "localhost") out.host = "127.0.0.1";
  unsigned char buf[sizeof(in6_addr)];
  if (!out.host.empty() && inet_pton(out.ipv6 ? AF_INET6 : AF_INET, out.host.c_str(), buf) != 1) {
    out.error =
        "invalid IP address " + quoted_excerpt(out.host) + " (use a numeric address or localhost)";
  }
  return out;
}
}  // namespace

std::string validate_listen_address(const std::string& address) { return split(address).error; }

sockaddr_storage resolve_listen_address(const std::string& address, bool ipv6_available) {
  const SplitAddress a = split(address);
  if (!a.error.empty())
    throw std::invalid_argument(quoted_excerpt(address, 200, false) + ": " + a.error);
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
}  // namespace ebpf_metricsd
