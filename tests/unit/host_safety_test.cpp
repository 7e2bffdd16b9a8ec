// The host-safety rule (docs/host-safety.md) on BPF objects opened, never loaded: the cases
// it must judge (tests/unit/bpf/host_safety_cases.bpf.c) and every tracer's object.
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf/host_safety.h"
#include "host_safety_cases.skel.h"

using namespace ebpf_metricsd;

namespace {

// The kernels of the matrix, as the rule sees them.
constexpr KernelAllocators kLinux5_10{false, false};
constexpr KernelAllocators kLinux6_1{true, false};
constexpr KernelAllocators kLinux6_12{true, true};
// The same kernels built with PREEMPT_RT (Debian's linux-image-rt-amd64).
constexpr KernelAllocators kLinux6_1_rt{true, false, true};
constexpr KernelAllocators kLinux6_12_rt{true, true, true};

using Cases = std::unique_ptr<host_safety_cases, void (*)(host_safety_cases*)>;
Cases open_cases() {
  Cases c(host_safety_cases__open(), host_safety_cases__destroy);
  REQUIRE(c);
  return c;
}

// Whether one of the rule's refusals says `text`.
bool refused(const std::vector<std::string>& refusals, const std::string& text) {
  return std::any_of(refusals.begin(), refusals.end(),
                     [&](const std::string& r) { return r.find(text) != std::string::npos; });
}

bool preallocated(const bpf_map* map) { return !(bpf_map__map_flags(map) & BPF_F_NO_PREALLOC); }

using Object = std::unique_ptr<bpf_object, void (*)(bpf_object*)>;

std::vector<std::string> tracer_objects() {
  std::vector<std::string> paths;
  std::stringstream ss(TRACER_BPF_OBJECTS);
  for (std::string p; std::getline(ss, p, ':');) paths.push_back(p);
  return paths;
}

}  // namespace

TEST_CASE("host safety: which hooks hold the scheduler's locks") {
  CHECK(hook_holds_scheduler_locks("tp_btf/sched_switch"));
  CHECK(hook_holds_scheduler_locks("raw_tp/sched_wakeup"));
  CHECK(hook_holds_scheduler_locks("tp_btf/sched_wakeup_new"));
  CHECK(hook_holds_scheduler_locks("tracepoint/sched/sched_switch"));
  CHECK(hook_holds_scheduler_locks("tp_btf/sched_stat_wait"));
  CHECK_FALSE(hook_holds_scheduler_locks("tp_btf/sys_enter"));
  CHECK_FALSE(hook_holds_scheduler_locks("raw_tp/sched_process_free"));
  CHECK_FALSE(hook_holds_scheduler_locks("tp_btf/sched_switch_x"));
  CHECK_FALSE(hook_holds_scheduler_locks("perf_event"));
}

TEST_CASE("host safety: task storage made on sched_switch is refused before 6.4, not after") {
  for (const KernelAllocators& k : {kLinux5_10, kLinux6_1}) {
    Cases c = open_cases();
    bpf_program__set_autoload(c->progs.on_switch_signal, false);
    bpf_program__set_autoload(c->progs.on_switch_subprog, false);
    const auto refusals = host_safety_refusals(c->obj, k);
    REQUIRE(refusals.size() == 1);
    CHECK(refused(refusals, "on_switch_storage on tp_btf/sched_switch would create"));
    CHECK_THROWS_AS(make_host_safe(c->obj, k), BpfError);
  }
  Cases c = open_cases();
  bpf_program__set_autoload(c->progs.on_switch_signal, false);
  bpf_program__set_autoload(c->progs.on_switch_subprog, false);
  CHECK(host_safety_refusals(c->obj, kLinux6_12).empty());
  // The same helper on sys_enter (no scheduler lock held) passes, but on PREEMPT_RT.
  bpf_program__set_autoload(c->progs.on_switch_storage, false);
  CHECK(host_safety_refusals(c->obj, kLinux5_10).empty());
}

TEST_CASE("host safety: on PREEMPT_RT before 6.4 task storage is made on no hook") {
  Cases c = open_cases();
  bpf_program__set_autoload(c->progs.on_switch_signal, false);
  bpf_program__set_autoload(c->progs.on_switch_subprog, false);
  const auto refusals = host_safety_refusals(c->obj, kLinux6_1_rt);
  REQUIRE(refusals.size() == 2);
  CHECK(refused(refusals, "on_switch_storage on tp_btf/sched_switch would create"));
  // sys_enter holds no scheduler lock, but its programs run with preemption off, where
  // kmalloc()'s sleeping locks must not be taken.
  CHECK(refused(refusals,
                "on_enter_storage on tp_btf/sys_enter calls a local-storage get helper, "
                "which may create local storage with preemption off"));
  CHECK_THROWS_AS(make_host_safe(c->obj, kLinux6_1_rt), BpfError);
  // With the BPF memory allocator for local storage, neither is refused.
  CHECK(host_safety_refusals(c->obj, kLinux6_12_rt).empty());
}

TEST_CASE("host safety: on scheduler hooks only the listed helpers, and no subprogram") {
  for (const KernelAllocators& k : {kLinux5_10, kLinux6_1, kLinux6_12, kLinux6_12_rt}) {
    Cases c = open_cases();
    bpf_program__set_autoload(c->progs.on_switch_storage, false);
    const auto refusals = host_safety_refusals(c->obj, k);
    REQUIRE(refusals.size() == 2);
    // bpf_send_signal takes the target's sighand lock and may wake it.
    CHECK(refused(refusals, "on_switch_signal on tp_btf/sched_switch calls helper " +
                                std::to_string(BPF_FUNC_send_signal) + " "));
    // A subprogram's instructions are out of sight before load, whatever it calls.
    CHECK(refused(refusals, "on_switch_subprog on tp_btf/sched_switch calls a subprogram"));
    CHECK_THROWS_AS(make_host_safe(c->obj, k), BpfError);
  }
}

TEST_CASE("host safety: run-time allocated hash maps are preallocated before 6.1, not after") {
  Cases old = open_cases();
  bpf_program__set_autoload(old->progs.on_switch_storage, false);
  bpf_program__set_autoload(old->progs.on_switch_subprog, false);
  bpf_program__set_autoload(old->progs.on_switch_signal, false);
  const HostSafetyReport r = make_host_safe(old->obj, kLinux5_10);
  CHECK(r.preallocated_maps == std::vector<std::string>{"lazily"});
  CHECK(r.preallocated_bytes >= 64 * 8);
  CHECK(preallocated(old->maps.lazily));
  CHECK(preallocated(old->maps.eager));
  // Task storage has no preallocated form: the map is left as it is (its programs are
  // what the rule judges).
  CHECK_FALSE(preallocated(old->maps.storage));

  for (const KernelAllocators& k : {kLinux6_1, kLinux6_12}) {
    Cases c = open_cases();
    bpf_program__set_autoload(c->progs.on_switch_storage, false);
    bpf_program__set_autoload(c->progs.on_switch_subprog, false);
    bpf_program__set_autoload(c->progs.on_switch_signal, false);
    CHECK(make_host_safe(c->obj, k).preallocated_maps.empty());
    CHECK_FALSE(preallocated(c->maps.lazily));
  }
}

TEST_CASE("host safety: every tracer starts on a kernel without the BPF memory allocators") {
  const auto paths = tracer_objects();
  REQUIRE(paths.size() >= 9);
  for (const std::string& path : paths) {
    INFO(path);
    Object obj(bpf_object__open_file(path.c_str(), nullptr), bpf_object__close);
    REQUIRE(obj);
    CHECK(host_safety_refusals(obj.get(), kLinux6_12).empty());
    CHECK(host_safety_refusals(obj.get(), kLinux6_12_rt).empty());

    // Each program the rule refuses on 5.10 or on 6.1 with PREEMPT_RT has a raw_tp twin that
    // it does not refuse: the tracer falls back to it (start_first_loadable) instead of going
    // down.
    std::set<std::string> names, refused;
    bpf_program* prog;
    bpf_object__for_each_program(prog, obj.get()) names.insert(bpf_program__name(prog));
    for (const KernelAllocators& k : {kLinux5_10, kLinux6_1_rt}) {
      for (const auto& reason : host_safety_refusals(obj.get(), k)) {
        const std::string name = reason.substr(8, reason.find(' ', 8) - 8);  // "program X on"
        refused.insert(name);
      }
    }
    for (const std::string& name : refused) {
      INFO(name);
      REQUIRE(name.size() > 4);
      REQUIRE(name.substr(name.size() - 4) == "_btf");
      const std::string twin = name.substr(0, name.size() - 4) + "_raw";
      CHECK(names.count(twin) == 1);
      CHECK(refused.count(twin) == 0);
    }

    // With the refused programs left out, the rest loads with every hash map preallocated.
    bpf_object__for_each_program(prog, obj.get()) {
      if (refused.count(bpf_program__name(prog))) bpf_program__set_autoload(prog, false);
    }
    make_host_safe(obj.get(), kLinux5_10);
    bpf_map* map;
    bpf_object__for_each_map(map, obj.get()) {
      INFO(bpf_map__name(map));
      const auto type = bpf_map__type(map);
      if (type == BPF_MAP_TYPE_HASH || type == BPF_MAP_TYPE_PERCPU_HASH) CHECK(preallocated(map));
    }
  }
}
