#include <catch2/catch.hpp>
#include <set>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/hook_probe.h"

using namespace ebpf_metricsd;

namespace {

// A kernel as the test describes it: which (kind, tracepoint) pairs attach.
class FakeProber : public HookProber {
 public:
  std::set<std::pair<HookKind, std::string>> attachable;
  std::vector<std::pair<HookKind, std::string>> asked;
  bool can_attach(HookKind kind, const std::string& tp) override {
    asked.emplace_back(kind, tp);
    return attachable.count({kind, tp}) > 0;
  }
  std::string failure(HookKind kind, const std::string& tp) const override {
    return attachable.count({kind, tp}) ? "" : "EPERM";
  }
};

const std::vector<std::string> kSys = {"sys_enter", "sys_exit"};

}  // namespace

TEST_CASE("tp_btf is preferred when it attaches everywhere") {
  FakeProber p;
  p.attachable = {{HookKind::TpBtf, "sys_enter"},
                  {HookKind::TpBtf, "sys_exit"},
                  {HookKind::RawTp, "sys_enter"},
                  {HookKind::RawTp, "sys_exit"}};
  CHECK(choose_hook(p, kSys, HookPreference::Auto) == HookKind::TpBtf);
}

TEST_CASE("raw_tp is the fallback when tp_btf fails on any hook") {
  FakeProber p;
  p.attachable = {{HookKind::TpBtf, "sys_enter"},
                  {HookKind::RawTp, "sys_enter"},
                  {HookKind::RawTp, "sys_exit"}};
  CHECK(choose_hook(p, kSys, HookPreference::Auto) == HookKind::RawTp);
}

TEST_CASE("a forced kind is never substituted") {
  FakeProber p;
  p.attachable = {{HookKind::RawTp, "sys_enter"}, {HookKind::RawTp, "sys_exit"}};
  CHECK_FALSE(choose_hook(p, kSys, HookPreference::TpBtf).has_value());
  CHECK(choose_hook(p, kSys, HookPreference::RawTp) == HookKind::RawTp);
}

TEST_CASE("no usable hook is an error naming every refusal") {
  FakeProber p;
  CHECK_FALSE(choose_hook(p, kSys, HookPreference::Auto).has_value());
  CHECK_THROWS_WITH(require_hook(p, kSys, HookPreference::Auto),
                    "no usable hook: tp_btf/sys_enter: EPERM; tp_btf/sys_exit: EPERM; "
                    "raw_tp/sys_enter: EPERM; raw_tp/sys_exit: EPERM");
}

TEST_CASE("hook kinds have the names exported in tracer_up") {
  CHECK(hook_name(HookKind::TpBtf) == "tp_btf");
  CHECK(hook_name(HookKind::RawTp) == "raw_tp");
  CHECK(hook_name(HookKind::Fentry) == "fentry");
}

TEST_CASE("hook preferences parse") {
  CHECK(parse_hook_preference("auto") == HookPreference::Auto);
  CHECK(parse_hook_preference("tp_btf") == HookPreference::TpBtf);
  CHECK(parse_hook_preference("raw_tp") == HookPreference::RawTp);
  CHECK_FALSE(parse_hook_preference("fentry").has_value());
}
