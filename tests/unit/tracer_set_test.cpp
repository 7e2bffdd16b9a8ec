// TracerSet brings the running tracers in line with a config: it starts, stops and restarts
// exactly the tracers whose sections changed (or that failed before), and no other.
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ebpf_metricsd/core/tracer_set.h"

using namespace ebpf_metricsd;

namespace {

struct Ledger {
  std::map<std::string, int> builds;
  std::map<std::string, int> alive;
  std::map<std::string, int> failures_left;
  std::map<std::string, int> drains;
  std::map<std::string, int> abandons;
  std::function<void(const std::string&)> on_drain;  // inside a tracer's drain
};

class RecordedTracer : public Tracer {
 public:
  RecordedTracer(Ledger& ledger, std::string name) : ledger_(ledger), name_(std::move(name)) {
    ++ledger_.alive[name_];
  }
  ~RecordedTracer() override { --ledger_.alive[name_]; }
  void start(HookProber&, HookPreference) override {}
  std::string hook() const override { return "none"; }
  void drain() override {
    ++ledger_.drains[name_];
    if (ledger_.on_drain) ledger_.on_drain(name_);
  }
  void abandon() override { ++ledger_.abandons[name_]; }

 private:
  Ledger& ledger_;
  std::string name_;
};

TracerConfig config(const std::string& name, const std::string& fingerprint = "a") {
  TracerConfig tc;
  tc.name = name;
  tc.enabled = true;
  tc.fingerprint = fingerprint;
  return tc;
}

}  // namespace

TEST_CASE("a reload restarts the tracers whose sections changed and no other") {
  MetricStore store;
  Ledger ledger;
  TracerSet set(store, [&](const TracerConfig& tc, MetricScope&) {
    ++ledger.builds[tc.name];
    if (ledger.failures_left[tc.name] > 0) {
      --ledger.failures_left[tc.name];
      throw std::runtime_error("object failed to load");
    }
    return std::unique_ptr<Tracer>(new RecordedTracer(ledger, tc.name));
  });

  SECTION("one tracer's options change: it restarts, the others do not") {
    REQUIRE(set.apply({config("a"), config("b"), config("c")}).empty());
    REQUIRE(set.apply({config("a", "changed"), config("b"), config("c")}).empty());
    CHECK(ledger.builds["a"] == 2);
    CHECK(ledger.builds["b"] == 1);
    CHECK(ledger.builds["c"] == 1);
    CHECK(ledger.alive["a"] == 1);  // the old one went before the new one came
    CHECK(set.running() == 3);
  }
  SECTION("an unchanged config restarts nothing") {
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    CHECK(ledger.builds["a"] == 1);
    CHECK(ledger.builds["b"] == 1);
  }
  SECTION("a tracer that failed is retried by the next apply, alone") {
    ledger.failures_left["b"] = 1;
    CHECK(set.apply({config("a"), config("b")}) == std::vector<std::string>{"b"});
    CHECK(set.running() == 1);
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    CHECK(ledger.builds["a"] == 1);
    CHECK(ledger.builds["b"] == 2);
    CHECK(set.running() == 2);
  }
  SECTION("disabling a tracer stops it and leaves the others running") {
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    TracerConfig off = config("b");
    off.enabled = false;
    REQUIRE(set.apply({config("a"), off}).empty());
    CHECK(ledger.alive["b"] == 0);
    CHECK(ledger.builds["a"] == 1);
    CHECK(set.running() == 1);
  }
}

TEST_CASE("stopping drains each tracer a last time, but none once the daemon exits") {
  MetricStore store;
  Ledger ledger;
  auto build = [&](const TracerConfig& tc, MetricScope&) {
    return std::unique_ptr<Tracer>(new RecordedTracer(ledger, tc.name));
  };
  SECTION("a stop without begin_exit drains every tracer once") {
    TracerSet set(store, build);
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    set.stop_all();
    CHECK(ledger.drains["a"] == 1);
    CHECK(ledger.drains["b"] == 1);
    CHECK(ledger.alive["a"] == 0);
  }
  SECTION("after begin_exit, neither a drain round nor the stop drains") {
    TracerSet set(store, build);
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    CHECK(set.drain());
    set.begin_exit();
    CHECK(set.drain());
    set.stop_all();
    CHECK(ledger.drains["a"] == 1);
    CHECK(ledger.drains["b"] == 1);
    CHECK(ledger.alive["a"] == 0);
    CHECK(ledger.alive["b"] == 0);
    CHECK(ledger.abandons["a"] == 1);
    CHECK(ledger.abandons["b"] == 1);
  }
  SECTION("begin_exit while a tracer drains: it is told to abandon, the next is not drained") {
    TracerSet set(store, build);
    REQUIRE(set.apply({config("a"), config("b")}).empty());
    ledger.on_drain = [&](const std::string& name) {
      if (name == "a") set.begin_exit();  // the signal arrives while "a" drains
    };
    CHECK(set.drain());
    CHECK(ledger.drains["a"] == 1);
    CHECK(ledger.abandons["a"] == 1);
    CHECK(ledger.drains["b"] == 0);
    set.stop_all();
    CHECK(ledger.drains["a"] == 1);
    CHECK(ledger.drains["b"] == 0);
  }
  SECTION("a stop without begin_exit abandons nothing") {
    TracerSet set(store, build);
    REQUIRE(set.apply({config("a")}).empty());
    set.stop_all();
    CHECK(ledger.abandons["a"] == 0);
  }
}
