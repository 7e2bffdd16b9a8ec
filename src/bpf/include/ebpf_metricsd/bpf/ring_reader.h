#pragma once
// A BPF ring buffer read on a thread of its own: each record is handed to a callback on that
// thread as soon as it arrives (the thread sleeps until a record or its stop comes), or on the
// caller's thread by catch_up(). Records are never dropped here: what the kernel side could
// not submit it counts itself.
//
// The thread waits on libbpf's epoll set with an eventfd of its own added (its stop) and reads
// the ring with ring_buffer__consume: ring_buffer__poll, which takes every entry of that set
// for a ring's index, must never be used on it. It wakes on the kernel's notification of each
// record: a producer that submits with BPF_RB_NO_WAKEUP would not wake it.

#include <bpf/libbpf.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace ebpf_metricsd {

class RingReader {
 public:
  // Called for every record, on the reader's thread; must not throw.
  using OnRecord = std::function<void(std::span<const std::byte> record)>;

  RingReader();
  // Starts reading `map` (a BPF_MAP_TYPE_RINGBUF); throws BpfError naming `what`.
  RingReader(const bpf_map* map, OnRecord on_record, const std::string& what);
  // The same for the ring buffer map behind `fd` (one the daemon made itself).
  RingReader(int fd, OnRecord on_record, const std::string& what);
  ~RingReader();
  RingReader(RingReader&&) noexcept;
  RingReader& operator=(RingReader&&) noexcept;

  // Hands over, on this thread, every record submitted before the call that the reader's
  // thread has not handed over yet (a reader that fell behind: records are complete up to
  // now when it returns).
  void catch_up();

  // Stops the thread (after the record it may be handing over) and frees the reader.
  void stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ebpf_metricsd
