#include "ebpf_metricsd/bpf/ring_reader.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <stop_token>
#include <thread>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/map_reader.h"

namespace ebpf_metricsd {

struct RingReader::State {
  OnRecord on_record;
  struct Deleter {
    void operator()(ring_buffer* r) const { ring_buffer__free(r); }
  };
  std::unique_ptr<ring_buffer, Deleter> ring;
  // Written when the thread is to stop: it waits for records or this, with no timeout (an
  // idle daemon's threads do not wake to look).
  int stop_fd = -1;
  std::mutex consuming;  // one consumer at a time: the thread, or catch_up()
  std::jthread thread;   // last: stops first
  ~State() {
    thread = {};  // joins before the descriptor goes
    if (stop_fd >= 0) close(stop_fd);
  }

  static int on_sample(void* self, void* data, std::size_t size) {
    static_cast<State*>(self)->on_record({static_cast<const std::byte*>(data), size});
    return 0;
  }
};

RingReader::RingReader(const bpf_map* map, OnRecord on_record, const std::string& what)
    : RingReader(kernel_stand_in() ? -1 : bpf_map__fd(map), std::move(on_record), what) {}

RingReader::RingReader(int fd, OnRecord on_record, const std::string& what) {
  if (kernel_stand_in() || fd < 0) return;  // nothing in the kernel to read
  state_ = std::make_unique<State>();
  state_->on_record = std::move(on_record);
  state_->ring.reset(ring_buffer__new(fd, &State::on_sample, state_.get(), nullptr));
  if (!state_->ring) throw BpfError(bpf_error_text(what + ": ring buffer", errno));
  // The thread waits on libbpf's epoll set with the stop descriptor added to it: it reads
  // the ring itself (ring_buffer__consume), so the set's entries are never taken for rings.
  const int epoll_fd = ring_buffer__epoll_fd(state_->ring.get());
  state_->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event stop_event{};
  stop_event.events = EPOLLIN;
  stop_event.data.u64 = UINT64_MAX;
  if (state_->stop_fd < 0 || epoll_ctl(epoll_fd, EPOLL_CTL_ADD, state_->stop_fd, &stop_event) != 0)
    throw BpfError(bpf_error_text(what + ": ring buffer's stop descriptor", errno));
  state_->thread = std::jthread([s = state_.get(), epoll_fd](const std::stop_token& stop) {
    const std::stop_callback wake(stop, [s] { eventfd_write(s->stop_fd, 1); });
    while (!stop.stop_requested()) {
      epoll_event ready{};
      epoll_wait(epoll_fd, &ready, 1, -1);
      std::lock_guard lock(s->consuming);
      ring_buffer__consume(s->ring.get());
    }
  });
}

RingReader::RingReader() = default;
RingReader::~RingReader() { stop(); }
RingReader::RingReader(RingReader&&) noexcept = default;
RingReader& RingReader::operator=(RingReader&& other) noexcept {
  stop();
  state_ = std::move(other.state_);
  return *this;
}

void RingReader::catch_up() {
  if (!state_) return;
  std::lock_guard lock(state_->consuming);
  ring_buffer__consume(state_->ring.get());
}

void RingReader::stop() {
  if (!state_) return;
  state_.reset();  // joins the thread, then frees the ring
}

}  // namespace ebpf_metricsd
