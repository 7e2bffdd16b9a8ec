#include "ebpf_metricsd/bpf/ring_reader.h"

#include <cerrno>
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
  std::jthread thread;  // last: stops first

  static int on_sample(void* self, void* data, std::size_t size) {
    static_cast<State*>(self)->on_record({static_cast<const std::byte*>(data), size});
    return 0;
  }
};

RingReader::RingReader(const bpf_map* map, OnRecord on_record, const std::string& what) {
  if (kernel_stand_in()) return;  // nothing in the kernel to read
  state_ = std::make_unique<State>();
  state_->on_record = std::move(on_record);
  state_->ring.reset(ring_buffer__new(bpf_map__fd(map), &State::on_sample, state_.get(), nullptr));
  if (!state_->ring) throw BpfError(bpf_error_text(what + ": ring buffer", errno));
  state_->thread = std::jthread([s = state_.get()](const std::stop_token& stop) {
    while (!stop.stop_requested()) ring_buffer__poll(s->ring.get(), 100);
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

void RingReader::stop() {
  if (!state_) return;
  state_->thread = {};  // joins before the ring buffer goes
  state_.reset();
}

}  // namespace ebpf_metricsd
