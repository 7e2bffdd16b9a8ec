// Entry point of the privileged test binaries: they need root and a kernel that loads BPF.
// Elsewhere they skip (exit 77, which ctest reports as skipped) with the reason, unless
// EBPF_METRICSD_REQUIRE_PRIVILEGED=1 (set by CI), where a skip would hide a failure.
#define CATCH_CONFIG_RUNNER
#include <bpf/bpf.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace {

std::string why_unprivileged() {
  if (geteuid() != 0) return "not running as root";
  if (access("/sys/kernel/btf/vmlinux", R_OK) != 0)
    return "no kernel BTF at /sys/kernel/btf/vmlinux";
  const bpf_insn ret0[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},
      {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},
  };
  const int fd = bpf_prog_load(BPF_PROG_TYPE_RAW_TRACEPOINT, "emd_check", "GPL", ret0, 2, nullptr);
  if (fd < 0) return std::string("the kernel refuses BPF programs: ") + std::strerror(errno);
  close(fd);
  return "";
}

}  // namespace

int main(int argc, char* argv[]) {
  const std::string why = why_unprivileged();
  if (!why.empty()) {
    const char* require = std::getenv("EBPF_METRICSD_REQUIRE_PRIVILEGED");
    if (require && std::string(require) == "1") {
      std::cerr << "FAIL: privileged tests required but " << why << "\n";
      return 1;
    }
    std::cerr << "SKIP: privileged tests need root and BPF: " << why << "\n";
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
