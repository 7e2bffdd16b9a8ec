// What the profile's kept samples cost in memory: fills a ProfileStore to its sample bound
// with samples as a busy host makes them (many threads, a workload label each, stacks of 24
// frames out of a few thousand) and prints the heap it holds, per sample and in all.
//
//   build/bench/profile_store_bench [max_samples]   (default 100000, the config's default)
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ebpf_metricsd/profile/profile_store.h"

using namespace ebpf_metricsd::profiling;

int main(int argc, char** argv) {
  const std::size_t max_samples = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100000;
  constexpr std::size_t kStacks = 4000, kDepth = 24, kPerBatch = 5000;
  // Stacks of functions named as C++ programs' are, in a few modules.
  std::vector<std::vector<Frame>> stacks(kStacks);
  for (std::size_t i = 0; i < kStacks; ++i) {
    for (std::size_t d = 0; d < kDepth; ++d) {
      Frame f;
      f.function = "app::module" + std::to_string(d % 7) + "::function_" +
                   std::to_string((i * 31 + d * 17) % 9000) + "(int, std::string const&)";
      f.module = "/usr/lib/x86_64-linux-gnu/libapp" + std::to_string(d % 5) + ".so.1";
      f.build_id = "0123456789abcdef0123456789abcdef01234567";
      f.address = 0x1000 + i * 64 + d;
      stacks[i].push_back(std::move(f));
    }
  }
  const std::size_t before = mallinfo2().uordblks;
  ProfileStore store({std::chrono::seconds(3600), max_samples});
  auto end = Clock::now();
  std::size_t added = 0;
  for (std::size_t batch = 0; added < 2 * max_samples; ++batch) {
    std::vector<Sample> samples;
    for (std::size_t k = 0; k < kPerBatch; ++k, ++added) {
      Sample s;
      s.pid = static_cast<std::uint32_t>(1000 + added % 300);
      s.tid = s.pid + static_cast<std::uint32_t>(added % 7);
      s.comm = "worker-" + std::to_string(added % 50);
      s.workload.cgroup = "/system.slice/service-" + std::to_string(added % 40) + ".service";
      s.kind = added % 3 ? SampleKind::OnCpu : SampleKind::OffCpu;
      s.count = 1;
      s.ns = 50'000'000;
      s.stack = static_cast<std::uint32_t>((added * 7919) % kStacks);
      samples.push_back(std::move(s));
    }
    end += std::chrono::seconds(1);
    store.add_batch(end, std::move(samples), stacks);
  }
  const std::size_t held = mallinfo2().uordblks - before;
  std::printf("samples kept %zu (bound %zu), frames kept %zu\n", store.samples_kept(), max_samples,
              store.frames_kept());
  std::printf("heap held %.1f MiB: %.0f bytes a sample, frames and stacks included\n",
              static_cast<double>(held) / (1 << 20),
              static_cast<double>(held) / static_cast<double>(store.samples_kept()));
  return 0;
}
