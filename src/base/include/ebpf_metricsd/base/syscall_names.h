#pragma once

#include <optional>
#include <string>

namespace ebpf_metricsd {

// Syscall names of the native architecture, from libseccomp's tables.
// "syscall_<nr>" for numbers libseccomp does not know (a kernel newer than the library).
std::string syscall_name(int nr);
std::optional<int> syscall_number(const std::string& name);

}  // namespace ebpf_metricsd
