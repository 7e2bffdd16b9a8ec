// TracerSet restarts the tracers of a group together: every member stops before any starts,
// so that the object they share is loaded anew, also when a member that failed is retried.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ebpf_metricsd/tracer_set.h"

using namespace ebpf_metricsd;

namespace {

// What the builder saw: the tracers alive now and the apply() that built each; for each
// build, the tracers alive then.
struct Ledger {
  int apply = 0;
  std::map<std::string, int> alive;
  struct Build {
    std::string name;
    int apply;
    std::map<std::string, int> alive;
  };
  std::vector<Build> builds;
  std::map<std::string, int> failures_left;
};

class RecordedTracer : public Tracer {
 public:
  RecordedTracer(Ledger& ledger, std::string name) : ledger_(ledger), name_(std::move(name)) {
    ledger_.alive[name_] = ledger_.apply;
  }
  ~RecordedTracer() override { ledger_.alive.erase(name_); }
  void start(HookProber&, HookPreference) override {}
  std::string hook() const override { return "none"; }
  void drain() override {}

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

// The group's members by the registry (the scheduler's two), and one tracer of no group.
const TracerDescriptor& grouped(std::size_t i) {
  std::vector<const TracerDescriptor*> members;
  for (const auto& d : tracer_registry()) {
    if (!d.traits.group.empty()) members.push_back(&d);
  }
  REQUIRE(members.size() >= 2);
  REQUIRE(members[0]->traits.group == members[1]->traits.group);
  return *members.at(i);
}

std::string ungrouped() {
  for (const auto& d : tracer_registry()) {
    if (d.traits.group.empty()) return d.name;
  }
  FAIL("no tracer outside a group");
  return {};
}

}  // namespace

TEST_CASE("a group's members all stop before any of them starts again") {
  const std::string a = grouped(0).name, b = grouped(1).name, other = ungrouped();
  MetricStore store;
  Ledger ledger;
  TracerSet set(store, [&](const TracerConfig& tc, MetricScope&) {
    ledger.builds.push_back({tc.name, ledger.apply, ledger.alive});
    if (ledger.failures_left[tc.name] > 0) {
      --ledger.failures_left[tc.name];
      throw std::runtime_error("object failed to load");
    }
    return std::unique_ptr<Tracer>(new RecordedTracer(ledger, tc.name));
  });
  const auto apply = [&](const std::vector<TracerConfig>& configs) {
    ++ledger.apply;
    return set.apply(configs);
  };
  const auto builds_of = [&](const std::string& name) {
    int n = 0;
    for (const auto& build : ledger.builds) n += build.name == name;
    return n;
  };
  // At every build of a group member, no member built by an earlier apply() was alive: the
  // object it gets is the one loaded for this start of the group.
  const auto restarted_whole = [&] {
    for (const auto& build : ledger.builds) {
      const std::string peer = build.name == a ? b : build.name == b ? a : "";
      const auto it = build.alive.find(peer);
      if (!peer.empty() && it != build.alive.end() && it->second < build.apply) return false;
    }
    return true;
  };

  SECTION("one member's options change: both restart, the other tracer does not") {
    REQUIRE(apply({config(a), config(b), config(other)}).empty());
    REQUIRE(apply({config(a, "changed"), config(b), config(other)}).empty());
    CHECK(builds_of(a) == 2);
    CHECK(builds_of(b) == 2);
    CHECK(builds_of(other) == 1);
    CHECK(restarted_whole());
    CHECK(set.running() == 3);
  }
  SECTION("an unchanged config restarts nothing") {
    REQUIRE(apply({config(a), config(b)}).empty());
    REQUIRE(apply({config(a), config(b)}).empty());
    CHECK(builds_of(a) == 1);
    CHECK(builds_of(b) == 1);
  }
  SECTION("a member that failed is retried with the whole group, not onto the live object") {
    ledger.failures_left[b] = 1;
    CHECK(apply({config(a), config(b)}) == std::vector<std::string>{b});
    CHECK(set.running() == 1);
    REQUIRE(apply({config(a), config(b)}).empty());
    CHECK(builds_of(a) == 2);
    CHECK(builds_of(b) == 2);
    CHECK(restarted_whole());
    CHECK(set.running() == 2);
  }
  SECTION("enabling or disabling a member restarts the one left") {
    REQUIRE(apply({config(a)}).empty());
    REQUIRE(apply({config(a), config(b)}).empty());
    CHECK(builds_of(a) == 2);
    TracerConfig off = config(b);
    off.enabled = false;
    REQUIRE(apply({config(a), off}).empty());
    CHECK(builds_of(a) == 3);
    CHECK(restarted_whole());
    CHECK(set.running() == 1);
  }
}
