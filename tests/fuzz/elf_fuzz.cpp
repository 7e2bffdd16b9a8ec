// libFuzzer target: a user's ELF file as the daemon reads it (elf_exercise.h). Built and run
// by tests/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "elf_exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ebpf_metricsd::test::exercise_elf(data, size);
  return 0;
}
