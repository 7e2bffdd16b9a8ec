// Odd config input: random mutations of the shipped config must either parse or fail with a
// ConfigError (which names the place); no other exception, no crash.
#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <sstream>

#include "ebpf_metricsd/daemon/config.h"

using namespace ebpf_metricsd;

TEST_CASE("mutated configs parse or fail with a ConfigError", "[mutations]") {
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
      switch (rng() % 8) {
        case 0:
          text[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 2:
          text.erase(pos, 1 + rng() % 16);
          break;
        case 3: {
          // A whole line again, after another: duplicate keys when the indent matches.
          const std::size_t from = text.rfind('\n', rng() % text.size());
          const std::size_t start = from == std::string::npos ? 0 : from + 1;
          const std::size_t end = text.find('\n', start);
          const std::string line =
              text.substr(start, end == std::string::npos ? std::string::npos : end - start + 1);
          const std::size_t at = text.find('\n', pos);
          text.insert(at == std::string::npos ? text.size() : at + 1, line);
          break;
        }
        case 4:
          // A second document.
          text.insert(text.rfind('\n', pos) == std::string::npos ? 0 : text.rfind('\n', pos) + 1,
                      "---\n");
          break;
        case 5:
          // Huge numbers where durations and integers stand.
          text.insert(pos, rng() % 2 ? "99999999999999999999" : "9223372036854775807d");
          break;
        case 6: {
          // Anchors, aliases and merge keys, which no setting accepts.
          static const char* const refs[] = {"&a ", "*a", "&b [*a, *a] ", "<<: *a\n", "!!str "};
          text.insert(pos, refs[rng() % 5]);
          break;
        }
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
      // One short line, whatever the mutation put in the value it quotes.
      CHECK(std::string(e.what()).size() < 1024);
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    } catch (const std::exception& e) {
      FAIL("mutation " << i << " threw a non-config error: " << e.what() << "\n" << text);
    }
  }
  INFO(valid << " valid, " << invalid << " rejected");
  CHECK(invalid > 0);
}
