// Odd config input: random mutations of the shipped config must either parse or fail with a
// ConfigError (which names the place); no other exception, no crash.
#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <sstream>

#include "ebpf_metricsd/config.h"

using namespace ebpf_metricsd;

TEST_CASE("mutated configs parse or fail with a ConfigError") {
  std::ifstream in(SOURCE_DIR "/config/ebpf-metricsd.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string seed = ss.str();
  REQUIRE(!seed.empty());
  const std::string alphabet = " \t\n:-[]{}#&*!|>'\"%@`,?0123456789abcxyz\x01\xff";
  std::mt19937 rng(1234);
  int valid = 0, invalid = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string text = seed;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const std::size_t pos = rng() % text.size();
      switch (rng() % 4) {
        case 0:
          text[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 2:
          text.erase(pos, 1 + rng() % 16);
          break;
        default:
          text.insert(pos, text.substr(rng() % text.size(), rng() % 64));
          break;
      }
    }
    try {
      parse_config(text, "fuzz.yaml");
      ++valid;
    } catch (const ConfigError& e) {
      ++invalid;
      INFO(e.what());
      CHECK(std::string(e.what()).rfind("fuzz.yaml", 0) == 0);
    } catch (const std::exception& e) {
      FAIL("mutation " << i << " threw a non-config error: " << e.what() << "\n" << text);
    }
  }
  INFO(valid << " valid, " << invalid << " rejected");
  CHECK(invalid > 0);
}
