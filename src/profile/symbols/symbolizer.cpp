// The one way a stack becomes frames (Symbolizer, symbols.h).
#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "ebpf_metricsd/profile/process_manager.h"
#include "ebpf_metricsd/profile/symbols.h"

// clang-format off
#include <linux/types.h>
#include "common/unwind.h"
// clang-format on

namespace ebpf_metricsd::profiling {

namespace {

// The last frame of a stack the walk in the kernel cut: why (mark: EMD_UNWIND_CUT_MARK | end).
Frame cut_frame(std::uint64_t mark) {
  Frame f;
  f.function = "[stack cut: " + std::string(walk_end_name(mark & 0xff)) + "]";
  f.module = "[unknown]";
  return f;
}

// The one frame of a user stack whose process's mappings were never read.
Frame mappings_not_read() {
  Frame f;
  f.function = "[mappings not read]";
  f.module = "[unknown]";
  return f;
}

bool tracing_frame(const std::string& fn) {
  static constexpr std::array<std::string_view, 6> prefixes = {
      "bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_get_stack", "perf_trace_"};
  for (auto p : prefixes) {
    if (fn.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

Symbolizer::Symbolizer(UserSymbols::Limits limits, std::string kallsyms, std::string modules)
    : kernel_(std::move(kallsyms), std::move(modules)), user_(limits) {}

void Symbolizer::set_file_source(FileSource source) {
  std::lock_guard lock(mutex_);
  files_ = std::move(source);
}

void Symbolizer::refresh_kernel() {
  // Modules and BPF programs come and go: the table is read again when they changed, looked
  // at once a second at most.
  const auto now = std::chrono::steady_clock::now();
  if (now - kernel_read_ < std::chrono::seconds(1)) return;
  kernel_.refresh();
  kernel_read_ = now;
}

std::vector<Frame> Symbolizer::kernel_frames(std::span<const std::uint64_t> ips,
                                             StackOrigin origin) {
  std::vector<Frame> frames;
  if (ips.empty()) return frames;
  frames.reserve(ips.size());
  std::lock_guard lock(mutex_);
  refresh_kernel();
  const bool call = origin == StackOrigin::Call;
  bool machinery = call;
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f = kernel_.resolve(ips[i], call || i > 0);
    if (machinery && tracing_frame(f.function)) continue;
    machinery = false;
    frames.push_back(std::move(f));
  }
  frames.shrink_to_fit();  // the tracing machinery's frames left room
  return frames;
}

std::vector<Frame> Symbolizer::user_frames(std::uint32_t pid_number,
                                           std::span<const std::uint64_t> ips, bool lines,
                                           std::uint64_t taken_by_ns) {
  // Not reserved for all of `ips`: a walk without frame pointers ends early, and callers
  // keep what is returned.
  std::vector<Frame> frames;
  if (ips.empty()) return frames;
  const auto pid = static_cast<pid_t>(pid_number);
  std::lock_guard lock(mutex_);
  install_captured();
  // Frames the walk kept by file need no mappings of the process; addresses do.
  const bool addresses = std::any_of(ips.begin(), ips.end(), [](std::uint64_t ip) {
    return !emd_unwind_file_frame(ip) && ip < EMD_UNWIND_CUT_MARK;
  });
  if (addresses) {
    user_.capture(pid);
    if (!user_.knows(pid)) {
      ++stacks_without_mappings_;
      return {mappings_not_read()};
    }
  }
  for (std::size_t i = 0; i < ips.size(); ++i) {
    if (ips[i] >= EMD_UNWIND_CUT_MARK) {
      // A walk in the kernel cut here, and says why (bpf/common/unwind.h).
      frames.push_back(cut_frame(ips[i]));
      break;
    }
    if (emd_unwind_file_frame(ips[i])) {
      // A frame the walk kept by its file and the offset in it.
      const auto id =
          static_cast<std::uint32_t>((ips[i] & ~EMD_UNWIND_FILE_FRAME) >> EMD_UNWIND_FILE_SHIFT);
      const std::uint64_t offset = ips[i] & EMD_UNWIND_OFFSET_MASK;
      std::optional<MappedFileRef> file = files_ ? files_(id) : std::nullopt;
      if (!file) {
        Frame unknown;
        unknown.function = "[unknown file]";
        unknown.module = "[unknown]";
        frames.push_back(std::move(unknown));
        break;
      }
      frames.push_back(user_.resolve_file(std::move(*file), offset, i > 0, lines));
      continue;
    }
    Frame f = user_.resolve(pid, ips[i], i > 0, lines);
    if (f.module == "[unknown]" && i == 0) {
      // Where the thread was is mapped since the mappings were read (dlopen): read them
      // again. (An unknown caller is a walk gone astray, not a new mapping.)
      user_.refresh(pid, taken_by_ns);
      f = user_.resolve(pid, ips[i], false, lines);
    }
    if (f.module == "[unknown]") break;
    frames.push_back(std::move(f));
  }
  // A walk cut where no frame could be named (its first address in no mapping read: the
  // process's first instructions after an exec) still says why.
  if (!ips.empty() && ips.back() >= EMD_UNWIND_CUT_MARK &&
      (frames.empty() || frames.back().function.rfind("[stack cut: ", 0) != 0)) {
    frames.push_back(cut_frame(ips.back()));
  }
  return frames;
}

std::vector<Frame> Symbolizer::frames(std::uint32_t pid,
                                      std::span<const std::uint64_t> kernel_stack,
                                      std::span<const std::uint64_t> user_stack, StackOrigin origin,
                                      bool lines, std::uint64_t taken_by_ns) {
  std::vector<Frame> out = kernel_frames(kernel_stack, origin);
  std::vector<Frame> user = user_frames(pid, user_stack, lines, taken_by_ns);
  out.insert(out.end(), std::make_move_iterator(user.begin()), std::make_move_iterator(user.end()));
  return out;
}

void Symbolizer::capture(std::uint32_t pid, bool execed) {
  auto snapshot = UserSymbols::snapshot(static_cast<pid_t>(pid));
  std::lock_guard lock(captured_mutex_);
  captured_.emplace_back(std::move(snapshot), execed);
}

void Symbolizer::install_captured() {
  std::vector<std::pair<std::shared_ptr<UserSymbols::Snapshot>, bool>> captured;
  {
    std::lock_guard lock(captured_mutex_);
    captured.swap(captured_);
  }
  for (auto& [snapshot, execed] : captured) user_.install(*snapshot, execed);
}

void Symbolizer::end_round() {
  std::lock_guard lock(mutex_);
  install_captured();
  user_.forget_exited();
}

Symbolizer::Sizes Symbolizer::sizes() {
  std::lock_guard lock(mutex_);
  Sizes s{};
  s.elf_files = user_.modules();
  s.processes = user_.processes();
  s.names = user_.names();
  s.kernel_symbols = kernel_.symbols();
  s.kernel_symbol_bytes = kernel_.bytes();
  s.refused = user_.refused();
  s.held = user_.held();
  s.table_bytes = user_.table_bytes();
  s.stacks_without_mappings = stacks_without_mappings_;
  return s;
}

}  // namespace ebpf_metricsd::profiling
