#include "ebpf_metricsd/http/request_grammar.h"

#include <strings.h>

#include <algorithm>
#include <charconv>

namespace ebpf_metricsd {

namespace {

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  return (c | 0x20) - 'a' + 10;
}

// tchar of RFC 9110 5.6.2.
bool is_token_char(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  for (const char t : std::string_view("!#$%&'*+-.^_`|~")) {
    if (c == static_cast<unsigned char>(t)) return true;
  }
  return false;
}

bool named(std::string_view name, const char* wanted) {
  return name.size() == std::char_traits<char>::length(wanted) &&
         strncasecmp(name.data(), wanted, name.size()) == 0;
}

GrammarError bad(std::string reason) { return {400, std::move(reason)}; }

}  // namespace

std::optional<GrammarError> check_request_target(std::string_view raw) {
  if (raw.empty() || raw.front() != '/') return bad("the request-target is not a path");
  if (const std::size_t q = raw.find('?'); q != std::string_view::npos) {
    std::size_t parameters = 1;
    for (std::size_t i = q + 1; i < raw.size(); ++i) parameters += raw[i] == '&';
    if (parameters > kMaxQueryParameters) {
      return bad("more than " + std::to_string(kMaxQueryParameters) + " query parameters");
    }
  }
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(raw[i]);
    if (c <= 0x20 || c >= 0x7F) {
      return bad("a control character, space or non-ASCII byte in the request-target");
    }
    if (c != '%') continue;
    if (i + 2 >= raw.size() || !is_hex(raw[i + 1]) || !is_hex(raw[i + 2])) {
      return bad("invalid percent-encoding in the request-target");
    }
    const int decoded = hex_value(raw[i + 1]) * 16 + hex_value(raw[i + 2]);
    if (decoded < 0x20 || decoded == 0x7F) {
      return bad("a percent-encoded control character in the request-target");
    }
    i += 2;
  }
  return std::nullopt;
}

std::optional<GrammarError> check_header_fields(
    const std::vector<std::pair<std::string_view, std::string_view>>& fields,
    std::string_view version) {
  if (fields.size() > kMaxHeaderFields) {
    return GrammarError{431, "more than " + std::to_string(kMaxHeaderFields) + " header fields"};
  }
  int hosts = 0;
  int lengths = 0;
  for (const auto& [name, value] : fields) {
    if (name.empty()) return bad("a header field with an empty name");
    for (const char c : name) {
      if (!is_token_char(static_cast<unsigned char>(c))) {
        return bad("a header field name with a character outside the token grammar");
      }
    }
    for (const char c : value) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7F) {
        return bad("a control character in a header field value");
      }
    }
    if (named(name, "Transfer-Encoding")) {
      return bad("Transfer-Encoding on a request: no route takes a body");
    }
    if (named(name, "Content-Length")) {
      ++lengths;
      std::string_view number = value;  // blanks around a field value are not part of it
      while (!number.empty() && (number.back() == ' ' || number.back() == '\t'))
        number.remove_suffix(1);
      if (number != "0" || lengths > 1) {
        return bad("Content-Length other than a single 0: no route takes a body");
      }
    }
    if (named(name, "Host")) ++hosts;
  }
  if (hosts > 1) return bad("more than one Host header field");
  if (hosts == 0 && version != "HTTP/1.0") {
    return bad("no Host header field in an HTTP/1.1 request");
  }
  return std::nullopt;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  return out;
}

std::string_view HeaderListElement::param(std::string_view name) const {
  for (const auto& [n, v] : params) {
    if (n == name) return v;
  }
  return {};
}

std::vector<HeaderListElement> parse_header_list(std::string_view value) {
  const auto trim = [](std::string_view t) {
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
    return t;
  };
  std::vector<HeaderListElement> out;
  while (true) {
    const std::size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    HeaderListElement e;
    bool first = true;
    while (true) {
      const std::size_t semi = item.find(';');
      const std::string_view part = trim(item.substr(0, semi));
      if (first) {
        e.token = ascii_lower(part);
        first = false;
      } else if (const auto eq = part.find('='); eq != std::string_view::npos) {
        std::string name = ascii_lower(trim(part.substr(0, eq)));
        std::string_view v = trim(part.substr(eq + 1));
        if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
        if (name == "q") {
          double q = 0;
          const auto res = std::from_chars(v.data(), v.data() + v.size(), q);
          const bool whole = res.ec == std::errc() && res.ptr == v.data() + v.size();
          e.q = whole && q >= 0 && q <= 1 ? q : 0;
        } else {
          e.params.emplace_back(std::move(name), std::string(v));
        }
      }
      if (semi == std::string_view::npos) break;
      item.remove_prefix(semi + 1);
    }
    if (!e.token.empty()) out.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace ebpf_metricsd
