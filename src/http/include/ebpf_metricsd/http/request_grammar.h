#pragma once
// What a request head must look like before a route sees it (RFC 9112, RFC 3986). The HTTP
// library parses the head; these checks refuse what it would otherwise reinterpret, so that
// the server's view of a request is the one a proxy in front of it has.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ebpf_metricsd {

// At most this many header fields in one request; more is answered 431.
constexpr std::size_t kMaxHeaderFields = 100;
// At most this many bytes of request head (request line and header fields); more is
// answered 431 (or 414 when the request line alone is longer).
constexpr std::size_t kMaxRequestHeadBytes = 16 * 1024;

// At most this many query parameters in one request-target; more is answered 400. No route
// reads more than three; the library stores every one in the connection's memory pool.
constexpr std::size_t kMaxQueryParameters = 64;

// A refusal: the status to answer and why, for the body and the debug log.
struct GrammarError {
  int status;
  std::string reason;
};

// The request-target as received, before percent-decoding: origin-form ("/path?query"),
// printable ASCII only, every '%' followed by two hex digits, and nothing that decodes to a
// control character (%00..%1F, %7F); at most kMaxQueryParameters query parameters.
std::optional<GrammarError> check_request_target(std::string_view raw);

// The header fields as the library kept them (names and values with their real lengths):
// no empty name, names of token characters only, no control characters in values but
// HTAB; no Transfer-Encoding and no Content-Length but a single "0" (no route takes a body,
// and framing a server does not use is framing it may read differently from a proxy);
// exactly one Host from HTTP/1.1 on, at most one for HTTP/1.0; at most kMaxHeaderFields.
std::optional<GrammarError> check_header_fields(
    const std::vector<std::pair<std::string_view, std::string_view>>& fields,
    std::string_view version);

// `s` in ASCII lower case (header names, tokens: case-insensitive).
std::string ascii_lower(std::string_view s);

// One element of a list-valued header field (RFC 9110 5.6.1) such as Accept or
// Accept-Encoding: `token;name=value;...` with its weight (RFC 9110 12.4.2).
struct HeaderListElement {
  std::string token;  // lower-cased: "text/plain", "gzip"
  // Names lower-cased, values unquoted, as sent; q is not among them.
  std::vector<std::pair<std::string, std::string>> params;
  double q = 1;  // 0..1; a q that is not a number in that range is 0 (the element refused)
  // The value of parameter `name` (lower case), "" when absent.
  std::string_view param(std::string_view name) const;
};
std::vector<HeaderListElement> parse_header_list(std::string_view value);

}  // namespace ebpf_metricsd
