// Overhead of a tracer's BPF side, in ns added per hooked event, against the floor: empty
// programs on the same hooks. Modes are interleaved round by round in one process so that
// machine noise hits them alike; medians are reported.
//
//   overhead_bench [--rounds N] [--calls N]
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ebpf_metricsd/bpf_support.h"
#include "ebpf_metricsd/config.h"
#include "ebpf_metricsd/tracer.h"
#include "floor_syscall.skel.h"

using namespace ebpf_metricsd;

namespace {

// Something attached for one measurement; destroying it detaches.
using Attachment = std::shared_ptr<void>;

struct Mode {
  std::string name;
  std::function<Attachment()> attach;  // nullptr result = nothing attached (baseline)
  std::vector<double> ns_per_event;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_per_call(const std::function<void()>& event, long calls) {
  for (long i = 0; i < calls / 10; ++i) event();  // warm caches and task storage
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) event();
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - t0;
  return took.count() / static_cast<double>(calls);
}

Attachment attach_floor_syscall() {
  auto skel = std::shared_ptr<struct floor_syscall>(floor_syscall__open_and_load(),
                                                    floor_syscall__destroy);
  if (!skel) throw BpfError("load floor_syscall");
  if (floor_syscall__attach(skel.get()) != 0) throw BpfError("attach floor_syscall");
  return skel;
}

Attachment tracer(const std::string& name, MetricStore& store) {
  const Config cfg = parse_config("tracers:\n  " + name + ":\n    enabled: true\n", "bench");
  for (const auto& tc : cfg.tracers) {
    if (tc.name != name) continue;
    std::shared_ptr<Tracer> t = find_tracer(name)->create(store, tc.options);
    KernelHookProber prober;
    t->start(prober, tc.hook);
    return t;
  }
  throw std::runtime_error("no tracer " + name);
}

void report(const char* workload, std::vector<Mode>& modes) {
  const double base = median(modes[0].ns_per_event);
  const double floor = median(modes[1].ns_per_event);
  std::printf("%s\n", workload);
  for (auto& m : modes) std::printf("  %-22s %8.1f ns/event\n", m.name.c_str(), median(m.ns_per_event));
  const double floor_added = floor - base;
  std::printf("  floor added            %8.1f ns\n", floor_added);
  for (std::size_t i = 2; i < modes.size(); ++i) {
    const double added = median(modes[i].ns_per_event) - base;
    std::printf("  %-22s %8.1f ns added, ratio to floor %.2f\n", modes[i].name.c_str(), added,
                added / floor_added);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  long calls = 300'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--calls")) calls = std::atol(argv[i + 1]);
  }
  // One CPU: the comparison is per event, and migrations only add noise.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof set, &set);

  MetricStore store;
  std::vector<Mode> modes = {
      {"baseline", [] { return Attachment(); }, {}},
      {"floor (empty progs)", attach_floor_syscall, {}},
      {"syscall_latency", [&] { return tracer("syscall_latency", store); }, {}},
  };
  const auto event = [] { syscall(SYS_getppid); };
  for (int r = 0; r < rounds; ++r) {
    // Rotate the order every round so no mode always runs first or last.
    for (std::size_t k = 0; k < modes.size(); ++k) {
      Mode& m = modes[(k + static_cast<std::size_t>(r)) % modes.size()];
      Attachment a = m.attach();
      m.ns_per_event.push_back(time_per_call(event, calls));
    }
  }
  std::printf("rounds %d x %ld calls, medians\n", rounds, calls);
  report("getppid() syscall: sys_enter + sys_exit", modes);
  return 0;
}
