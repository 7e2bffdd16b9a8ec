// The cost of an unwind table (profile/unwind_table.h): for each file given, the time to build
// it (the fastest of three builds) and its size, in rows and in the bytes the kernel keeps.
//
//   build/bench/unwind_table_bench FILE...
#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "ebpf_metricsd/profile/elf_file.h"
#include "ebpf_metricsd/profile/unwind_table.h"

using namespace ebpf_metricsd::profiling;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: unwind_table_bench FILE...\n");
    return 2;
  }
  std::printf("%-44s %9s %9s %8s %7s %10s %9s %s\n", "file", "fdes", "rows", "pages", "rules",
              "kernel KiB", "build ms", "frame pointers");
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string path = argv[i];
    ElfRefusal refused{};
    auto file = ElfFile::open(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK), ElfLimits{},
                              refused);
    if (!file) {
      std::printf("%-44s refused: %s\n", path.c_str(),
                  std::string(elf_refusal_name(refused)).c_str());
      status = 1;
      continue;
    }
    double best_ms = 0;
    std::optional<UnwindTable> table;
    UnwindTableRefusal why{};
    for (int round = 0; round < 3; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      table = build_unwind_table(*file, UnwindTableLimits{}, why);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round == 0 || ms < best_ms) best_ms = ms;
    }
    if (!table) {
      std::printf("%-44s no table: %s\n", path.c_str(),
                  std::string(unwind_table_refusal_name(why)).c_str());
      status = 1;
      continue;
    }
    std::printf("%-44s %9zu %9zu %8zu %7zu %10.1f %9.1f %s\n", path.c_str(), table->fdes,
                table->rows.size(), table->pages.size(), table->rules.size(),
                static_cast<double>(table->kernel_bytes()) / 1024, best_ms,
                table->frame_pointers ? "yes" : "no");
  }
  return status;
}
