#pragma once
// HTTP basic auth against bcrypt hashes, as the exporter-toolkit web config has them, made to
// hold against hostile clients. Knows nothing of sockets: the server hands it the
// Authorization header's value.

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace ebpf_metricsd {

class BasicAuth {
 public:
  // user -> bcrypt hash. `concurrent_bcrypt` bcrypt checks run at once at most (one per core
  // is the server's choice); more wait their turn.
  BasicAuth(std::map<std::string, std::string> users, unsigned concurrent_bcrypt);

  bool enabled() const { return !users_.empty(); }

  // Whether the value of an Authorization header (absent: nullopt) names a user and the
  // right password. Anything malformed is simply false: a scheme other than Basic, base64
  // that is invalid or longer than 1 KiB decoded, no colon, a NUL or other control byte in the
  // user or password (bcrypt would read a password only up to a NUL).
  //
  // Every check that reaches bcrypt costs the same whatever the user name: one bcrypt per
  // distinct cost among the configured hashes, against the user's hash at its own cost and a
  // decoy hash at every other, so that neither an unknown name nor a user with a cheaper
  // hash can be told apart by time. A password that passed once is remembered (by its
  // SHA-256) for its user, so an authorized scraper pays bcrypt once, not on every scrape,
  // and never waits behind the bcrypt checks of failed attempts.
  bool check(const std::optional<std::string_view>& authorization);
  // check()'s answer where it needs no bcrypt (malformed, missing or remembered
  // credentials), else nullopt: the caller then runs check() where waiting does no harm.
  std::optional<bool> check_without_bcrypt(const std::optional<std::string_view>& authorization);

  // The user and password of a Basic Authorization value, or nullopt when malformed.
  static std::optional<std::pair<std::string, std::string>> parse(std::string_view value);

  // How many checks went to bcrypt (tests).
  std::uint64_t bcrypt_checks() const;

 private:
  using Digest = std::array<unsigned char, 32>;  // SHA-256
  static Digest digest_of(const std::string& password);
  bool remembered(const std::string& user, const Digest& digest);
  bool bcrypt_all_costs(const std::string& user, const std::string& password);

  std::map<std::string, std::string> users_;
  std::map<int, std::string> decoys_;  // bcrypt cost -> a hash of no real password
  mutable std::mutex mutex_;           // guards verified_, running_, checks_
  std::condition_variable turn_;
  std::map<std::string, Digest> verified_;
  unsigned max_running_;
  unsigned running_ = 0;
  std::uint64_t checks_ = 0;
};

// A bcrypt hash of `password` with a fresh salt ("" if the system cannot make one); `prefix`
// "$2b$" or "$2y$" (htpasswd's).
std::string bcrypt_hash(const std::string& password, unsigned long cost,
                        const char* prefix = "$2b$");

// Checks a password against a bcrypt hash ($2a$, $2b$, $2y$) in constant time.
bool bcrypt_matches(const std::string& password, const std::string& hash);

// Whether `hash` has the form of a bcrypt hash ($2a$, $2b$, $2y$; 60 characters).
bool is_bcrypt_hash(const std::string& hash);

// The cost of a bcrypt hash ("$2y$10$..." -> 10), or nullopt.
std::optional<int> bcrypt_cost(const std::string& hash);

}  // namespace ebpf_metricsd
