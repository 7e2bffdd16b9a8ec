#include "ebpf_metricsd/metrics/log2_histogram.h"
#include <algorithm>

#include <cmath>
#include <numeric>
#include <stdexcept>

#include "ebpf_metricsd/base/yaml_reader.h"

namespace ebpf_metricsd {

namespace {

// Exponents a classic bound may take: slot 1 up to the last slot.
constexpr int kSecondsZeroExp = -30;  // EMD_SECONDS_ZERO_EXP
constexpr int kBytesZeroExp = -1;     // EMD_BYTES_ZERO_EXP

struct Unit {
  const char* suffix;
  double factor;
};

// "<number><unit>": a positive finite amount of the layout's exported unit.
double parse_amount(const std::string& text, bool seconds) {
  static const Unit time_units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3},
                                    {"s", 1},     {"m", 60},    {"h", 3600}};
  static const Unit size_units[] = {
      {"B", 1}, {"KiB", 1024}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024}, {"", 1}};
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || !std::isfinite(number) || number <= 0 || text[0] == '+' ||
      text.find_first_of("xXpPeE") < used) {
    throw std::invalid_argument("");
  }
  const std::string unit = text.substr(used);
  for (const auto& u :
       seconds ? std::span<const Unit>(time_units) : std::span<const Unit>(size_units)) {
    if (unit == u.suffix) return number * u.factor;
  }
  throw std::invalid_argument("");
}

}  // namespace

std::uint64_t parse_nanoseconds(const std::string& text) {
  double seconds = 0;
  try {
    seconds = parse_amount(text, true);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("invalid duration " + text + " (expected e.g. 750us, 10ms, 1s)");
  }
  if (seconds * 1e9 < 1 || seconds > 1e9) {
    throw std::invalid_argument("duration " + text + " is out of range");
  }
  return static_cast<std::uint64_t>(std::llround(seconds * 1e9));
}

namespace {

std::string format_power(int exp, bool seconds) {
  if (!seconds) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    return std::to_string(1ULL << (exp % 10)) + units[exp / 10];
  }
  const double v = std::ldexp(1.0, exp);
  static const Unit units[] = {{"h", 3600},  {"m", 60},    {"s", 1},
                               {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  for (const auto& u : units) {
    if (v >= u.factor || u.factor == 1e-9) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.4g%s", v / u.factor, u.suffix);
      return buf;
    }
  }
  return {};
}

}  // namespace

Log2Layout Log2Layout::seconds(int min_exp, int max_exp) {
  return {1e9, kSecondsZeroExp, min_exp, max_exp};
}

Log2Layout Log2Layout::bytes(int min_exp, int max_exp) {
  return {1.0, kBytesZeroExp, min_exp, max_exp};
}

double Log2Layout::upper_bound(std::size_t i) const {
  return std::ldexp(1.0, min_exp + static_cast<int>(i));
}

double Log2Layout::zero_threshold() const { return std::ldexp(1.0, zero_exp); }

void Log2Layout::classic(std::span<const std::uint64_t> slots,
                         std::vector<std::uint64_t>& cumulative) const {
  cumulative.assign(finite_buckets(), 0);
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] == 0) continue;
    const int e = exponent(k);
    if (e > max_exp) continue;  // +Inf only
    cumulative[static_cast<std::size_t>(std::max(e, min_exp) - min_exp)] += slots[k];
  }
  std::partial_sum(cumulative.begin(), cumulative.end(), cumulative.begin());
}

Log2Layout read_buckets(YamlMapReader& options, const Log2Layout& defaults) {
  if (!options.has("buckets")) return defaults;
  auto range = options.get_map("buckets");
  const bool seconds = defaults.is_seconds();
  const int lowest = defaults.zero_exp + 1;
  const int highest = defaults.zero_exp + static_cast<int>(Log2Layout::kSlots) - 1;
  const std::string what = seconds ? "a duration such as 500ns, 1us, 250ms or 16s"
                                   : "a size in bytes such as 8, 512B or 4KiB";
  auto read = [&](const std::string& key, int fallback, bool round_up) {
    if (!range.has(key)) return fallback;
    const std::string text = range.get_string(key, "");
    double amount = 0;
    try {
      amount = parse_amount(text, seconds);
    } catch (const std::invalid_argument&) {
      range.fail(key, quoted_excerpt(text) + " is not " + what);
    }
    int exp = static_cast<int>(round_up ? std::ceil(std::log2(amount) - 1e-12)
                                        : std::floor(std::log2(amount) + 1e-12));
    // The smallest amount measured (1 ns, 1 byte) rounds down below the lowest bucket that
    // holds it.
    if (!round_up && exp == lowest - 1 && amount >= (seconds ? 1e-9 : 1.0)) exp = lowest;
    if (exp < lowest || exp > highest) {
      range.fail(key, quoted_excerpt(text) + " is outside " + format_power(lowest, seconds) +
                          " .. " + format_power(highest, seconds));
    }
    return exp;
  };
  Log2Layout out = defaults;
  out.min_exp = read("min", defaults.min_exp, false);
  out.max_exp = read("max", defaults.max_exp, true);
  range.finish();
  if (out.min_exp > out.max_exp) {
    options.fail("buckets", "min (" + format_power(out.min_exp, seconds) + ") is above max (" +
                                format_power(out.max_exp, seconds) + ")");
  }
  return out;
}

const Exemplar* classic_exemplar(const Log2Layout& layout, const Log2HistogramState& state,
                                 std::size_t bucket) {
  const Exemplar* latest = nullptr;
  const int last = layout.max_exp - layout.min_exp;
  for (const auto& [slot, e] : state.exemplars) {
    // The classic bucket of a slot: 0 for slot 0 and every exponent up to min_exp.
    const int exp = layout.exponent(slot);
    const int b = slot == 0 || exp <= layout.min_exp ? 0 : std::min(exp - layout.min_exp, last + 1);
    if (static_cast<std::size_t>(b) != bucket) continue;
    if (!latest || e.timestamp >= latest->timestamp) latest = &e;
  }
  return latest;
}

std::uint64_t Log2HistogramState::count() const {
  return std::accumulate(slots.begin(), slots.end(), std::uint64_t{0});
}

NativeBuckets native_buckets(const Log2Layout& layout, std::span<const std::uint64_t> slots) {
  NativeBuckets out;
  std::int64_t previous_count = 0;
  int next_index = 0;  // index after the last bucket written
  bool any = false;
  for (std::size_t k = 1; k < slots.size(); ++k) {
    if (slots[k] == 0) continue;
    const int index = layout.exponent(k);
    const int gap = index - next_index;
    if (any && gap <= 2) {
      for (int i = 0; i < gap; ++i) {  // empty buckets inside the span
        out.deltas.push_back(-previous_count);
        previous_count = 0;
      }
      out.spans.back().length += static_cast<std::uint32_t>(gap) + 1;
    } else {
      out.spans.push_back({any ? gap : index, 1});
    }
    const auto count = static_cast<std::int64_t>(slots[k]);
    out.deltas.push_back(count - previous_count);
    previous_count = count;
    next_index = index + 1;
    any = true;
  }
  return out;
}

}  // namespace ebpf_metricsd
