#include "ebpf_metricsd/profile/profile_metrics.h"

#include <malloc.h>

#include <string>

namespace ebpf_metricsd::profiling {

ProfileMetrics::ProfileMetrics(MetricScope& scope)
    : scope_(scope),
      caches_(scope.declare({"ebpf_metricsd_profile_cache_entries",
                             "Entries of the profile's symbolization caches and tables: ELF "
                             "files open, processes whose mappings are kept, names cached, "
                             "kernel symbols, frames and samples kept.",
                             MetricType::Gauge,
                             {"cache"}})),
      memory_(scope.declare({"ebpf_metricsd_profile_memory_bytes",
                             "What the profile holds, by part: names and lines cached, DWARF "
                             "read for lines (its sections, counted twice), the symbol and CFI "
                             "tables of the open files, JIT perf maps, the kernel's symbol "
                             "table, the samples kept, the stacks and the frames they use, the "
                             "maps the walk of user stacks reads (unwind_maps, in the kernel), "
                             "and the freed memory the allocator keeps (allocator_free).",
                             MetricType::Gauge,
                             {"part"}})),
      refused_(scope.declare({"ebpf_metricsd_profile_files_refused_total",
                              "Files processes map that the symbolizer refused to read, by why: "
                              "not a regular file, too large, not an x86-64 ELF file, tables "
                              "outside the file, too many symbols, unreadable; perf_map: a "
                              "JIT's perf map not read.",
                              MetricType::Counter,
                              {"reason"}})),
      no_lines_(scope.declare({"ebpf_metricsd_profile_files_without_lines_total",
                               "Files with DWARF whose source lines were not read (with lines: "
                               "true), by why: over_budget (its DWARF did not fit in the DWARF "
                               "budget), bad_line_table (libdw could not read a line table of "
                               "it). Their frames keep their names.",
                               MetricType::Counter,
                               {"reason"}})),
      no_mappings_(scope.declare({"ebpf_metricsd_profile_stacks_without_mappings_total",
                                  "User stacks (of samples, waits and slow events) whose "
                                  "process exited before the daemon read its mappings: their "
                                  "user part is the one frame [mappings not read].",
                                  MetricType::Counter,
                                  {}})),
      samples_(scope.declare({"ebpf_metricsd_profile_samples_total",
                              "On-CPU samples and off-CPU waits the profile recorded.",
                              MetricType::Counter,
                              {"state"}})),
      unwinds_(scope.declare({"ebpf_metricsd_profile_unwinds_total",
                              "User stacks walked in the kernel with the unwind tables, by how "
                              "the walk ended: complete, or cut (the frames found are kept, and "
                              "a last frame says why).",
                              MetricType::Counter,
                              {"result"}})),
      tables_(scope.declare({"ebpf_metricsd_profile_unwind_tables_total",
                             "Unwind tables of the files processes map, by how building and "
                             "loading them came out: loaded, or why the file has none (its "
                             "frames end the walks that reach them).",
                             MetricType::Counter,
                             {"result"}})) {}

void ProfileMetrics::publish(Profiles& profiles, ProfileCapture& capture,
                             const ProcessManager* walker, const bpf_map* walk_ends) {
  if (walk_ends) {
    const WalkEnds ended = walk_ends_since(walk_ends, walk_ends_);
    for (std::uint32_t e = 0; e < ended.size(); ++e)
      scope_.add(unwinds_, {std::string(walk_end_name(e))}, ended[e]);
  }
  const ProfileCapture::Counts c = capture.take_counts();
  scope_.add(samples_, {"on_cpu"}, c.on_cpu);
  scope_.add(samples_, {"off_cpu"}, c.off_cpu);
  scope_.add_dropped("stack_expired", c.stacks_expired);
  scope_.add_dropped("stack_collision", c.collisions);
  ProfileStore& store = profiles.store();
  const std::uint64_t store_dropped = store.dropped_samples();
  scope_.add_dropped("store_full", store_dropped - store_dropped_);
  store_dropped_ = store_dropped;
  const auto sizes = profiles.symbolizer().sizes();
  scope_.set(caches_, {"elf_files"}, static_cast<double>(sizes.elf_files));
  scope_.set(caches_, {"processes"}, static_cast<double>(sizes.processes));
  scope_.set(caches_, {"names"}, static_cast<double>(sizes.names));
  scope_.set(caches_, {"kernel_symbols"}, static_cast<double>(sizes.kernel_symbols));
  scope_.set(memory_, {"names"}, static_cast<double>(sizes.held.name_bytes));
  scope_.set(memory_, {"dwarf"}, static_cast<double>(sizes.held.dwarf_bytes));
  scope_.set(memory_, {"elf_tables"}, static_cast<double>(sizes.table_bytes));
  scope_.set(memory_, {"jit_maps"}, static_cast<double>(sizes.held.jit_bytes));
  if (walker) {
    const ProcessManager::Counts w = walker->counts();
    scope_.set(memory_, {"unwind_maps"}, static_cast<double>(w.kernel_bytes));
    for (TableResult r : kTableResults) {
      const auto i = static_cast<std::size_t>(r);
      scope_.add(tables_, {std::string(table_result_name(r))}, w.tables[i] - tables_seen_[i]);
    }
    tables_seen_ = w.tables;
  }
  scope_.add(no_lines_, {"over_budget"}, sizes.held.lines_over_budget - lines_over_budget_);
  lines_over_budget_ = sizes.held.lines_over_budget;
  scope_.add(no_lines_, {"bad_line_table"}, sizes.held.dwarf_broken - dwarf_broken_);
  dwarf_broken_ = sizes.held.dwarf_broken;
  scope_.add(refused_, {"perf_map"}, sizes.held.jit_maps_refused - jit_refused_);
  jit_refused_ = sizes.held.jit_maps_refused;
  scope_.add(no_mappings_, {}, sizes.stacks_without_mappings - no_mappings_seen_);
  no_mappings_seen_ = sizes.stacks_without_mappings;
  for (ElfRefusal why : kElfRefusals) {
    const auto i = static_cast<std::size_t>(why);
    scope_.add(refused_, {std::string(elf_refusal_name(why))}, sizes.refused[i] - refused_seen_[i]);
  }
  refused_seen_ = sizes.refused;
  // The stacks the daemon holds: the store's table and the kernel stacks the capture keeps;
  // the frames: the store's and the named stacks the capture keeps for the next cuts.
  const ProfileStore::Bytes kept = store.bytes();
  const ProfileCapture::Held held = capture.held();
  scope_.set(caches_, {"stacks"}, static_cast<double>(held.stacks));
  scope_.set(memory_, {"kernel_symbols"}, static_cast<double>(sizes.kernel_symbol_bytes));
  scope_.set(memory_, {"samples"}, static_cast<double>(kept.samples));
  scope_.set(memory_, {"stacks"}, static_cast<double>(kept.stacks + held.stack_bytes));
  scope_.set(memory_, {"frames"}, static_cast<double>(kept.frames + held.frame_bytes));
  // What the allocator keeps of freed memory (in its arenas, not given back): resident where
  // it was touched.
  scope_.set(memory_, {"allocator_free"}, static_cast<double>(mallinfo2().fordblks));
  scope_.set(caches_, {"frames"}, static_cast<double>(store.frames_kept()));
  scope_.set(caches_, {"samples"}, static_cast<double>(store.samples_kept()));
}

}  // namespace ebpf_metricsd::profiling
