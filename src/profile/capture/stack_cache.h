#pragma once
// The stacks the profile's kernel side keeps in emd_stacks (bpf/common/stacks.bpf.h), copied
// at each cut and kept while samples may name them, and their frames, named once and kept
// for the next few cuts. Not thread-safe: ProfileCapture calls it under its cut's lock.

#include <bpf/libbpf.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ebpf_metricsd/profile/profile_store.h"
#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

class StackCache {
 public:
  // `max_stacks`: what the kernel side keeps; the daemon keeps four times as many.
  StackCache(Symbolizer& symbolizer, bool lines, std::uint32_t max_stacks)
      : symbolizer_(symbolizer), lines_(lines), max_stacks_(max_stacks) {}

  // Copies every stack of the kernel's stack map and empties it: a stack recorded once is
  // found here later too, also when a program found it in the map just before it was
  // deleted. Then a new generation of cached frames begins.
  void read(const bpf_map* stacks, Clock::time_point now);
  // The frames of a kept stack: none for hash 0 (no stack), nullptr where its bytes are not
  // here (not kept by the kernel side, or no longer by the daemon). Valid until
  // forget_unused(). An on-CPU sample's kernel stack is where the thread was interrupted;
  // an off-CPU one was taken where the thread switched out.
  const std::vector<Frame>* kernel_frames(std::uint64_t hash, bool off_cpu);
  const std::vector<Frame>* user_frames(std::uint32_t tgid, std::uint64_t hash);
  // Named stacks not used in the last few cuts go, and those of processes that have exited
  // (their last samples read). Raw stacks stay as long as a profile is
  // kept, since a thread that blocked with one may wake much later; past max_stacks * 4 of
  // them, the least recently used go first. Call once the batch was added: the store no
  // longer views the frames.
  void forget_unused();

  // Stacks found under a hash that named another before (counted, then forgotten).
  std::uint64_t take_collisions() { return std::exchange(collisions_, 0); }
  struct Held {
    std::size_t stacks = 0;       // raw stacks kept
    std::size_t stack_bytes = 0;  // theirs
    std::size_t frame_bytes = 0;  // the named frames'
  };
  Held held() const;

 private:
  struct RawStack {
    std::vector<std::uint64_t> ips;
    std::uint64_t check = 0;  // the kernel side's second hash (common/stacks.h)
    Clock::time_point seen;
  };
  struct Cached {
    std::vector<Frame> frames;
    std::uint64_t seen = 0;  // the generation that last used it
  };
  const RawStack* raw_stack(std::uint64_t hash);

  Symbolizer& symbolizer_;
  bool lines_;
  std::uint32_t max_stacks_;
  std::uint64_t generation_ = 0;
  std::uint64_t collisions_ = 0;
  std::unordered_map<std::uint64_t, RawStack> raw_;
  std::map<std::pair<std::uint64_t, bool>, Cached> kernel_cache_;  // by (hash, off-CPU)
  std::map<std::pair<std::uint32_t, std::uint64_t>, Cached> user_cache_;
};

}  // namespace ebpf_metricsd::profiling
