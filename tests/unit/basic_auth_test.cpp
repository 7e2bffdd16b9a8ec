// Basic auth against hostile credentials: malformed headers, NUL bytes, user-name timing,
// and failed attempts that must not hold up an authorized scraper.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../test_support.h"
#include "ebpf_metricsd/http/basic_auth.h"

using namespace ebpf_metricsd;

namespace {

std::string basic(const std::string& user, const std::string& password) {
  return "Basic " + test::base64(user + ":" + password);
}

double seconds_of(BasicAuth& auth, const std::string& header) {
  const auto t0 = std::chrono::steady_clock::now();
  (void)auth.check(std::string_view(header));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The least of several timings: what the work itself costs, since a busy machine only ever
// adds time to a run.
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

TEST_CASE("malformed Authorization values are refused, never an error") {
  BasicAuth auth({{"prometheus", bcrypt_hash("secret", 4)}}, 2);
  CHECK(auth.check(std::string_view(basic("prometheus", "secret"))));
  for (const std::string& bad : std::vector<std::string>{
           std::string("Basic ===="), std::string("Basic ="), std::string("Basic a==="),
           std::string("Basic !!notbase64"), std::string("Basic cHJvbWV0aGV1cw"),  // no padding
           std::string("Basic cHJv=bWV0"), std::string("Bearer abc"), std::string("Basic"),
           std::string(""), basic("prometheus", std::string("secret\0junk", 11)),
           basic("prometheus", "secret\n"), basic(std::string("prom\0etheus", 11), "secret"),
           basic("prometheus", std::string(2048, 'x')), "Basic " + std::string(4096, 'A'),
           basic("prometheus", "secret").substr(0, 10), test::base64("prometheus:secret")}) {
    INFO("Authorization: " << bad.substr(0, 80));
    CHECK_FALSE(auth.check(std::string_view(bad)));
  }
  CHECK_FALSE(auth.check(std::nullopt));
  CHECK(BasicAuth::parse("basic " + test::base64("a:b:c")) ==
        std::make_pair(std::string("a"), std::string("b:c")));
  CHECK(auth.check(std::string_view(basic("prometheus", "secret"))));
}

TEST_CASE("no user-name timing oracle, whatever the users' bcrypt costs") {
  // A cheap hash for one user, a dear one for the other: an unknown name, the cheap user and
  // the dear user with a wrong password must all cost the same (one bcrypt per cost).
  BasicAuth auth({{"cheap", bcrypt_hash("a", 4)}, {"dear", bcrypt_hash("b", 9)}}, 4);
  // `one`: what one cost-9 bcrypt alone takes, which every check must have paid at least.
  const std::string nine = bcrypt_hash("z", 9);
  std::vector<double> unknown, cheap, dear, one;
  for (int i = 0; i < 9; ++i) {  // interleaved, so that the machine's load hits all four
    unknown.push_back(seconds_of(auth, basic("nobody", "x")));
    cheap.push_back(seconds_of(auth, basic("cheap", "x")));
    dear.push_back(seconds_of(auth, basic("dear", "x")));
    const auto t0 = std::chrono::steady_clock::now();
    (void)bcrypt_matches("x", nine);
    one.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double u = least(unknown), c = least(cheap), d = least(dear);
  INFO("least seconds of 9: unknown " << u << ", cheap user " << c << ", dear user " << d
                                      << ", one cost-9 bcrypt " << least(one));
  CHECK(c / u > 0.7);
  CHECK(c / u < 1.4);
  CHECK(d / u > 0.7);
  CHECK(d / u < 1.4);
  CHECK(c > 0.7 * least(one));
}

TEST_CASE("failed attempts queue for bcrypt; a remembered password does not") {
  BasicAuth auth({{"prometheus", bcrypt_hash("right", 11)}}, 1);
  REQUIRE(auth.check(std::string_view(basic("prometheus", "right"))));  // remembered now
  const auto checks = auth.bcrypt_checks();
  // Four wrong passwords at once: one bcrypt at a time, each well over 50 ms.
  std::vector<std::future<bool>> wrong;
  for (int i = 0; i < 4; ++i) {
    wrong.push_back(std::async(std::launch::async, [&auth, i] {
      return auth.check(std::string_view(basic("prometheus", "wrong" + std::to_string(i))));
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<double> authorized;
  for (int i = 0; i < 20; ++i) authorized.push_back(seconds_of(auth, basic("prometheus", "right")));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& f : wrong) CHECK_FALSE(f.get());
  const double wrong_wait =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("authorized check max " << *std::max_element(authorized.begin(), authorized.end())
                               << " s while the wrong ones took " << wrong_wait << " s more");
  // The remembered password never waited for the queue of bcrypt checks.
  CHECK(*std::max_element(authorized.begin(), authorized.end()) * 20 < wrong_wait);
  CHECK(auth.bcrypt_checks() == checks + 4);
}
