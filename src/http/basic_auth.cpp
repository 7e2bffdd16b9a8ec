#include "ebpf_metricsd/http/basic_auth.h"

#include <crypt.h>
#include <gnutls/crypto.h>
#include <strings.h>

#include <algorithm>
#include <memory>

namespace ebpf_metricsd {

namespace {

constexpr std::size_t kMaxCredentials = 1024;

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict RFC 4648 base64 with padding; nullopt for anything else.
std::optional<std::string> base64_decode(std::string_view in) {
  if (in.empty() || in.size() % 4 != 0 || in.size() / 4 * 3 > kMaxCredentials + 2) {
    return std::nullopt;
  }
  std::size_t pad = 0;
  while (pad < 2 && in.size() > pad && in[in.size() - 1 - pad] == '=') ++pad;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < in.size() - pad; ++i) {
    const int v = base64_value(in[i]);
    if (v < 0) return std::nullopt;  // also a third '=' or one in the middle
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  // The bits left over must be zero padding (canonical encoding).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

bool has_control_byte(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

// Equal bytes, in a time that depends on the length only.
bool same_bytes(const unsigned char* a, const unsigned char* b, std::size_t n) {
  unsigned char diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool is_bcrypt_hash(const std::string& h) {
  return h.size() == 60 && h[0] == '$' && h[1] == '2' &&
         (h[2] == 'a' || h[2] == 'b' || h[2] == 'y') && h[3] == '$';
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
         same_bytes(reinterpret_cast<const unsigned char*>(computed.data()),
                    reinterpret_cast<const unsigned char*>(hash.data()), hash.size());
}

std::optional<int> bcrypt_cost(const std::string& hash) {
  // $2a$, $2b$, $2y$ followed by a two-digit cost and '$'.
  if (hash.size() < 7 || hash[0] != '$' || hash[1] != '2' || hash[3] != '$' || hash[6] != '$')
    return std::nullopt;
  if (hash[4] < '0' || hash[4] > '9' || hash[5] < '0' || hash[5] > '9') return std::nullopt;
  return (hash[4] - '0') * 10 + (hash[5] - '0');
}

BasicAuth::BasicAuth(std::map<std::string, std::string> users, unsigned concurrent_bcrypt)
    : users_(std::move(users)), max_running_(std::max(1u, concurrent_bcrypt)) {
  for (const auto& [user, hash] : users_) {
    const int cost = bcrypt_cost(hash).value_or(10);
    if (!decoys_.count(cost)) {
      decoys_[cost] = bcrypt_hash("no password is this", static_cast<unsigned long>(cost));
    }
  }
}

std::optional<std::pair<std::string, std::string>> BasicAuth::parse(std::string_view value) {
  if (value.size() < 6 || strncasecmp(value.data(), "Basic ", 6) != 0) return std::nullopt;
  value.remove_prefix(6);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  const auto decoded = base64_decode(value);
  if (!decoded || decoded->size() > kMaxCredentials) return std::nullopt;
  const auto colon = decoded->find(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string user = decoded->substr(0, colon), password = decoded->substr(colon + 1);
  if (has_control_byte(user) || has_control_byte(password)) return std::nullopt;
  return std::make_pair(std::move(user), std::move(password));
}

bool BasicAuth::remembered(const std::string& user, const Digest& digest) {
  std::lock_guard lock(mutex_);
  const auto it = verified_.find(user);
  return it != verified_.end() && same_bytes(it->second.data(), digest.data(), digest.size());
}

bool BasicAuth::bcrypt_all_costs(const std::string& user, const std::string& password) {
  {
    std::unique_lock lock(mutex_);
    turn_.wait(lock, [&] { return running_ < max_running_; });
    ++running_;
    ++checks_;
  }
  const auto it = users_.find(user);
  const std::optional<int> user_cost = it == users_.end() ? std::nullopt : bcrypt_cost(it->second);
  bool ok = false;
  for (const auto& [cost, decoy] : decoys_) {
    if (user_cost && *user_cost == cost) {
      ok = bcrypt_matches(password, it->second);
    } else {
      (void)bcrypt_matches(password, decoy);
    }
  }
  {
    std::lock_guard lock(mutex_);
    --running_;
  }
  turn_.notify_one();
  return ok;
}

BasicAuth::Digest BasicAuth::digest_of(const std::string& password) {
  Digest digest{};
  gnutls_hash_fast(GNUTLS_DIG_SHA256, password.data(), password.size(), digest.data());
  return digest;
}

std::optional<bool> BasicAuth::check_without_bcrypt(
    const std::optional<std::string_view>& authorization) {
  if (users_.empty()) return true;
  if (!authorization) return false;
  const auto credentials = parse(*authorization);
  if (!credentials) return false;
  const auto& [user, password] = *credentials;
  if (users_.count(user) && remembered(user, digest_of(password))) return true;
  return std::nullopt;
}

bool BasicAuth::check(const std::optional<std::string_view>& authorization) {
  if (const auto quick = check_without_bcrypt(authorization)) return *quick;
  const auto [user, password] = *parse(*authorization);
  if (!bcrypt_all_costs(user, password)) return false;
  std::lock_guard lock(mutex_);
  verified_[user] = digest_of(password);
  return true;
}

std::uint64_t BasicAuth::bcrypt_checks() const {
  std::lock_guard lock(mutex_);
  return checks_;
}

}  // namespace ebpf_metricsd
