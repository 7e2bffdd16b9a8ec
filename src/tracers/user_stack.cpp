#include "user_stack.h"

#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

#include "ebpf_metricsd/bpf/bpf_support.h"

// clang-format off
#include <linux/types.h>
#include "ptregs_offset.skel.h"
// clang-format on

namespace ebpf_metricsd {

namespace {
std::uint32_t measure() {
  std::string btf_path;
  const auto opts = skeleton_open_opts(btf_path);
  SkeletonPtr<ptregs_offset, ptregs_offset__destroy> skel(ptregs_offset__open_opts(&opts));
  if (!skel) return 0;
  skel->rodata->target_tgid = static_cast<__u32>(getpid());
  if (ptregs_offset__load(skel.get()) != 0) return 0;
  try {
    const BpfLink link = attach_program(skel->progs.measure_ptregs);
    syscall(SYS_getppid);
  } catch (const BpfError& e) {
    spdlog::warn("user registers: cannot measure where the kernel saves them: {}", e.what());
    return 0;
  }
  const std::uint64_t offset = skel->bss->offset;
  // On the task's kernel stack, which is 16 or 32 KiB: anything else is no measurement.
  if (offset == 0 || offset > (1u << 20)) return 0;
  spdlog::info("user registers saved {} bytes above the task's kernel stack", offset);
  return static_cast<std::uint32_t>(offset);
}
}  // namespace

std::uint32_t user_regs_offset() {
  static std::once_flag once;
  static std::uint32_t offset = 0;
  std::call_once(once, [] { offset = measure(); });
  return offset;
}

}  // namespace ebpf_metricsd
