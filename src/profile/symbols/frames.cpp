// What frames hold on the heap (memory accounting).
#include <string>
#include <vector>

#include "ebpf_metricsd/profile/symbols.h"

namespace ebpf_metricsd::profiling {

std::size_t string_heap_bytes(const std::string& s) {
  // Past libstdc++'s inline buffer of 15 characters, the heap holds capacity + 1.
  return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

std::size_t lines_heap_bytes(const std::vector<SourceLine>& lines) {
  std::size_t n = lines.capacity() * sizeof(SourceLine);
  for (const SourceLine& l : lines) n += string_heap_bytes(l.function) + string_heap_bytes(l.file);
  return n;
}

std::size_t frame_heap_bytes(const Frame& f) {
  return string_heap_bytes(f.function) + string_heap_bytes(f.module) +
         string_heap_bytes(f.build_id) + lines_heap_bytes(f.lines);
}

std::size_t frames_bytes(const std::vector<Frame>& frames) {
  std::size_t n = frames.capacity() * sizeof(Frame);
  for (const Frame& f : frames) n += frame_heap_bytes(f);
  return n;
}

}  // namespace ebpf_metricsd::profiling
