#include "ebpf_metricsd/base/syscall_names.h"

#include <seccomp.h>

#include <cstdlib>
#include <memory>

namespace ebpf_metricsd {

std::string syscall_name(int nr) {
  std::unique_ptr<char, decltype(&std::free)> name(
      seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr), &std::free);
  if (!name) return "syscall_" + std::to_string(nr);
  return name.get();
}

std::optional<int> syscall_number(const std::string& name) {
  const int nr = seccomp_syscall_resolve_name_arch(SCMP_ARCH_NATIVE, name.c_str());
  // libseccomp answers with a negative pseudo number for syscalls this arch lacks.
  if (nr == __NR_SCMP_ERROR || nr < 0) return std::nullopt;
  return nr;
}

}  // namespace ebpf_metricsd
