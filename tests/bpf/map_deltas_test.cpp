// PerCpuDeltas on a real per-CPU hash: an idle entry whose owner is gone is taken out of
// the map after its last values were counted, and one made anew counts from zero.
#include <bpf/bpf.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/map_deltas.h"
#include "ebpf_metricsd/bpf/map_reader.h"

using namespace ebpf_metricsd;

TEST_CASE("retiring an idle entry deletes it once counted; a new one counts from zero",
          "[map_deltas]") {
  const int fd = bpf_map_create(BPF_MAP_TYPE_PERCPU_HASH, "emd_retire", 8, 8, 16, nullptr);
  REQUIRE(fd >= 0);
  const auto cpus = static_cast<std::size_t>(possible_cpus());
  std::vector<std::uint64_t> v(cpus, 0);
  std::uint64_t key = 42;
  v[0] = 5;
  REQUIRE(bpf_map_update_elem(fd, &key, v.data(), BPF_ANY) == 0);

  const auto map = read_map_fd(fd, /*per_cpu=*/true);
  PerCpuDeltas deltas(1);
  std::uint64_t seen = 0;
  const PerCpuDeltas::Visit visit = [&](const void*, const std::uint64_t* d) { seen += d[0]; };
  const PerCpuDeltas::Retire gone = [](const void*) { return true; };
  deltas.drain_hash(*map, sizeof key, 16, visit, gone);  // changed since the last drain: kept
  CHECK(seen == 5);
  CHECK(bpf_map_lookup_elem(fd, &key, v.data()) == 0);
  deltas.drain_hash(*map, sizeof key, 16, visit, gone);  // idle and gone: retired
  CHECK(deltas.retired() == 1);
  CHECK(bpf_map_lookup_elem(fd, &key, v.data()) != 0);
  CHECK(seen == 5);

  // An event after the retirement makes the entry anew; its count starts from zero.
  v.assign(cpus, 0);
  v[cpus - 1] = 3;
  REQUIRE(bpf_map_update_elem(fd, &key, v.data(), BPF_ANY) == 0);
  deltas.drain_hash(*map, sizeof key, 16, visit, [](const void*) { return false; });
  CHECK(seen == 8);
  deltas.drain_hash(*map, sizeof key, 16, visit, [](const void*) { return false; });  // kept
  CHECK(bpf_map_lookup_elem(fd, &key, v.data()) == 0);
  CHECK(seen == 8);
  close(fd);
}
