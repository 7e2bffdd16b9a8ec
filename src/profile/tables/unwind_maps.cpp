#include "ebpf_metricsd/profile/unwind_maps.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <tuple>

#include "ebpf_metricsd/bpf/bpf_support.h"
#include "ebpf_metricsd/bpf/host_safety.h"

namespace ebpf_metricsd::profiling {

namespace {

// The rows a table of n rows takes in the row array: whole elements of two (n is at most
// the array's rows, an even count).
std::uint32_t row_span(std::uint32_t n) { return n + (n & 1u); }

int make_map(bpf_map_type type, const char* name, std::uint32_t key, std::uint32_t value,
             std::uint32_t entries, std::uint32_t flags = 0) {
  LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = flags);
  const int fd = bpf_map_create(type, name, key, value, entries, &opts);
  if (fd < 0) throw BpfError(bpf_error_text(std::string("creating map ") + name, fd));
  return fd;
}

bool key_less(const emd_unwind_map_key& a, const emd_unwind_map_key& b) {
  return std::tie(a.prefixlen, a.tgid, a.addr) < std::tie(b.prefixlen, b.tgid, b.addr);
}

// The trie's key of the block of 2^bits bytes at addr (bits 0: the address alone).
emd_unwind_map_key mapping_key(std::uint32_t tgid, std::uint64_t addr, unsigned bits) {
  emd_unwind_map_key k{};
  k.prefixlen = 32 + (64 - bits);
  k.tgid = htobe32(tgid);
  k.addr = htobe64(addr);
  return k;
}

// Each block of `ranges` with its value.

std::map<emd_unwind_map_key, emd_unwind_mapping, decltype(&key_less)> blocks_of(
    std::uint32_t tgid, const std::vector<MappedRange>& ranges) {
  std::map<emd_unwind_map_key, emd_unwind_mapping, decltype(&key_less)> out(&key_less);
  for (const MappedRange& r : ranges) {
    emd_unwind_mapping v{};
    v.file = r.file;
    v.bias = r.bias;
    v.off_bias = r.off_bias;
    v.start = r.start;
    v.end = r.end;
    for (const auto& k : mapping_blocks(tgid, r.start, r.end)) out[k] = v;
  }
  return out;
}

}  // namespace

std::vector<emd_unwind_map_key> mapping_blocks(std::uint32_t tgid, std::uint64_t start,
                                               std::uint64_t end) {
  std::vector<emd_unwind_map_key> out;
  for (std::uint64_t a = start; a < end;) {
    // The largest block aligned at a that ends by `end`.
    unsigned bits = a == 0 ? 63 : static_cast<unsigned>(__builtin_ctzll(a));
    while (bits > 0 && ((end - a) >> bits) == 0) --bits;
    out.push_back(mapping_key(tgid, a, bits));
    const std::uint64_t size = std::uint64_t{1} << bits;
    if (a + size < a) break;  // the top of the address space
    a += size;
  }
  return out;
}

UnwindMaps::UnwindMaps(const UnwindMapLimits& limits) : limits_(limits) {
  try {
    mappings_ = make_map(BPF_MAP_TYPE_LPM_TRIE, "emd_unwind_mappings", sizeof(emd_unwind_map_key),
                         sizeof(emd_unwind_mapping), limits.mapping_blocks, BPF_F_NO_PREALLOC);
    procs_ = make_map(BPF_MAP_TYPE_LRU_HASH, "emd_unwind_procs", sizeof(__u32),
                      sizeof(emd_unwind_proc), limits.processes);
    // Written by the daemon alone (the kernel side only looks up): where the kernel lets
    // perf-event and tracing programs use a hash that is not preallocated (6.1, the BPF
    // memory allocator's kernels; before, the verifier refuses a perf-event program one),
    // an element is made as it is written, so a host with 300 processes holds 300, not room
    // for 16,384 (1.7 MiB; the 16,384 pages' 1.2 MiB).
    const __u32 as_written = kernel_allocators().hash_elements ? BPF_F_NO_PREALLOC : 0;
    settled_ = make_map(BPF_MAP_TYPE_HASH, "emd_unwind_settled", sizeof(__u32),
                        sizeof(emd_unwind_settled), limits.processes, as_written);
    files_ = make_map(BPF_MAP_TYPE_HASH, "emd_unwind_files", sizeof(__u32), sizeof(emd_unwind_file),
                      limits.files, as_written);
    pages_ = make_map(BPF_MAP_TYPE_HASH, "emd_unwind_pages", sizeof(emd_unwind_page_key),
                      sizeof(emd_unwind_page), limits.pages, as_written);
    rows_ = make_map(BPF_MAP_TYPE_ARRAY, "emd_unwind_rows", sizeof(__u32),
                     sizeof(emd_unwind_row_pair), limits.rows / 2);
    rules_ = make_map(BPF_MAP_TYPE_ARRAY, "emd_unwind_rules", sizeof(__u32),
                      sizeof(emd_unwind_rule), limits.rules);
    wants_ = make_map(BPF_MAP_TYPE_RINGBUF, "emd_unwind_wants", 0, 0, limits.wants_bytes);
    version_ = make_map(BPF_MAP_TYPE_ARRAY, "emd_unwind_version", sizeof(__u32), sizeof(__u64), 1,
                        BPF_F_MMAPABLE);
    void* word = mmap(nullptr, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)),
                      PROT_READ | PROT_WRITE, MAP_SHARED, version_, 0);
    if (word == MAP_FAILED) throw BpfError(bpf_error_text("mapping emd_unwind_version", -errno));
    version_word_ = static_cast<std::uint64_t*>(word);
  } catch (...) {
    for (const auto& [name, fd] : maps()) {
      if (fd >= 0) close(fd);
    }
    throw;
  }
  free_[0] = limits.rows & ~1u;
}

UnwindMaps::~UnwindMaps() {
  if (version_word_) munmap(version_word_, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  for (const auto& [name, fd] : maps()) {
    if (fd >= 0) close(fd);
  }
}

void UnwindMaps::share(bpf_object* obj) const {
  for (const auto& [name, fd] : maps()) {
    bpf_map* map = bpf_object__find_map_by_name(obj, name);
    if (!map) throw BpfError(std::string("the walker's map ") + name + " is missing");
    if (const int err = bpf_map__reuse_fd(map, fd))
      throw BpfError(bpf_error_text(std::string("sharing ") + name, err));
  }
}

std::uint32_t UnwindMaps::take_rows(std::uint32_t n) {
  reclaim();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const std::uint32_t first = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_[first + n] = left;
    return first;
  }
  return std::numeric_limits<std::uint32_t>::max();
}

void UnwindMaps::give_rows(std::uint32_t first, std::uint32_t n) {
  if (n == 0) return;
  auto [it, fresh] = free_.emplace(first, n);
  if (!fresh) return;
  // Merged with its neighbours.
  if (auto next = std::next(it); next != free_.end() && first + n == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

void UnwindMaps::reclaim() {
  const auto now = std::chrono::steady_clock::now();
  while (!retired_.empty() && now - retired_.front().at >= kGrace) {
    give_rows(retired_.front().first, retired_.front().count);
    retired_.pop_front();
  }
  while (!retired_rules_.empty() && now - retired_rules_.front().second >= kGrace) {
    free_rules_.push_back(retired_rules_.front().first);
    retired_rules_.pop_front();
  }
}

UnwindMaps::Loaded UnwindMaps::load(std::uint32_t file, const UnwindTable& table) {
  std::lock_guard lock(mutex_);
  // No file takes more than half of the rows: one huge library (libLLVM-15's 980,000) would
  // otherwise leave no room for the rest of a host's code while any process maps it.
  if (table.rows.size() > (limits_.rows / 2 & ~1u)) return Loaded::RowsFull;
  const auto n = static_cast<std::uint32_t>(table.rows.size());
  reclaim();
  // The rules this table adds to those written: each a free index (one retired for kGrace,
  // or never used), given back if the table does not load.
  std::vector<std::uint16_t> global(table.rules.size());
  std::vector<std::pair<std::uint16_t, UnwindRule>> added;
  const auto give_back = [&] {
    for (const auto& [index, rule] : added) free_rules_.push_back(index);
  };
  for (std::size_t i = 0; i < table.rules.size(); ++i) {
    if (auto it = rule_index_.find(table.rules[i]); it != rule_index_.end()) {
      global[i] = it->second.index;
      continue;
    }
    std::uint16_t index = 0;
    if (!free_rules_.empty()) {
      index = free_rules_.back();
      free_rules_.pop_back();
    } else if (next_rule_ < limits_.rules &&
               next_rule_ <= std::numeric_limits<std::uint16_t>::max()) {
      index = static_cast<std::uint16_t>(next_rule_++);
    } else {
      give_back();
      return Loaded::RulesFull;
    }
    global[i] = index;
    added.emplace_back(index, table.rules[i]);
  }
  // Two rows an element: a table takes whole elements.
  const std::uint32_t span = row_span(n);
  const std::uint32_t first = take_rows(span);
  if (first == std::numeric_limits<std::uint32_t>::max()) {
    give_back();
    return Loaded::RowsFull;
  }
  const auto fail = [&](Loaded why) {
    give_rows(first, span);
    give_back();
    return why;
  };
  for (const auto& [index, rule] : added) {
    const __u32 key = index;
    const emd_unwind_rule value = rule.kernel();
    if (bpf_map_update_elem(rules_, &key, &value, BPF_ANY) != 0) return fail(Loaded::RulesFull);
  }
  // Rows, in batches where the kernel takes them (5.6), else one element by one. An odd
  // table's last element has a second row past its count, never read.
  const std::uint32_t elements = span / 2;
  std::vector<__u32> keys(elements);
  std::vector<emd_unwind_row_pair> values(elements);
  for (std::uint32_t i = 0; i < n; ++i) {
    emd_unwind_row& row = values[i / 2].row[i % 2];
    row.lo = table.rows[i].lo;
    row.rule = global[table.rows[i].rule];
  }
  for (std::uint32_t e = 0; e < elements; ++e) keys[e] = first / 2 + e;
  __u32 count = elements;
  if (elements > 0 &&
      bpf_map_update_batch(rows_, keys.data(), values.data(), &count, nullptr) != 0) {
    for (std::uint32_t i = 0; i < elements; ++i) {
      if (bpf_map_update_elem(rows_, &keys[i], &values[i], BPF_ANY) != 0)
        return fail(Loaded::RowsFull);
    }
  }
  Table t{first, n, {}, {}};
  for (const auto& p : table.pages) {
    const emd_unwind_page_key key{file, p.page};
    const emd_unwind_page value{first + p.first, p.count};
    if (bpf_map_update_elem(pages_, &key, &value, BPF_ANY) != 0) {
      for (const auto& k : t.pages) bpf_map_delete_elem(pages_, &k);
      return fail(Loaded::PagesFull);
    }
    t.pages.push_back(key);
  }
  // Loaded: the rules it uses are its until it is unloaded.
  for (const auto& [index, rule] : added) rule_index_.emplace(rule, RuleUse{index, 0});
  for (const UnwindRule& rule : table.rules) {
    ++rule_index_.at(rule).refs;
    t.rules.push_back(rule);
  }
  emd_unwind_file state{EMD_UNWIND_FILE_LOADED, table.frame_pointers ? 1u : 0u};
  bpf_map_update_elem(files_, &file, &state, BPF_ANY);
  tables_[file] = std::move(t);
  return Loaded::Ok;
}

void UnwindMaps::set_state(std::uint32_t file, std::uint32_t state) {
  const emd_unwind_file value{state, 0};
  bpf_map_update_elem(files_, &file, &value, BPF_ANY);
}

void UnwindMaps::unload(std::uint32_t file) {
  std::lock_guard lock(mutex_);
  bpf_map_delete_elem(files_, &file);
  auto it = tables_.find(file);
  if (it == tables_.end()) return;
  for (const auto& k : it->second.pages) bpf_map_delete_elem(pages_, &k);
  const auto now = std::chrono::steady_clock::now();
  retired_.push_back({it->second.first, row_span(it->second.count), now});
  // Its rules no other table uses: their indexes, once no walk can be reading them.
  for (const UnwindRule& rule : it->second.rules) {
    auto r = rule_index_.find(rule);
    if (r == rule_index_.end() || --r->second.refs > 0) continue;
    retired_rules_.emplace_back(r->second.index, now);
    rule_index_.erase(r);
  }
  tables_.erase(it);
}

bool UnwindMaps::write_mappings(std::uint32_t tgid, const std::vector<MappedRange>& before,
                                const std::vector<MappedRange>& now, bool rewrite) {
  const auto old_blocks = blocks_of(tgid, before);
  const auto new_blocks = blocks_of(tgid, now);
  const auto kept = [&](const auto& key, const auto& value) {
    auto old = old_blocks.find(key);
    return !rewrite && old != old_blocks.end() &&
           std::memcmp(&old->second, &value, sizeof value) == 0;
  };
  // A changed block goes before it is written again: a full trie refuses even an update in
  // place (before Linux 6.13), and the block left as it was would name another file's frames.
  for (const auto& [key, value] : old_blocks) {
    auto now_at = new_blocks.find(key);
    if (now_at == new_blocks.end() || !kept(key, now_at->second))
      bpf_map_delete_elem(mappings_, &key);
  }
  bool all = true;
  for (const auto& [key, value] : new_blocks) {
    if (kept(key, value)) continue;
    if (bpf_map_update_elem(mappings_, &key, &value, BPF_ANY) != 0) all = false;
  }
  return all;
}

std::uint32_t UnwindMaps::file_at(std::uint32_t tgid, std::uint64_t addr) const {
  const emd_unwind_map_key key = mapping_key(tgid, addr, 0);
  emd_unwind_mapping m{};
  return bpf_map_lookup_elem(mappings_, &key, &m) == 0 ? m.file : 0;
}

bool UnwindMaps::proc(std::uint32_t tgid, emd_unwind_proc& out) const {
  return bpf_map_lookup_elem(procs_, &tgid, &out) == 0;
}

std::uint64_t UnwindMaps::settle(std::uint32_t tgid, emd_unwind_settled s, std::uint64_t epoch) {
  s.epoch = epoch != 0 ? epoch : ++epochs_;
  bpf_map_update_elem(settled_, &tgid, &s, BPF_ANY);
  bump_version();
  return s.epoch;
}

void UnwindMaps::forget(std::uint32_t tgid) {
  bpf_map_delete_elem(settled_, &tgid);
  bpf_map_delete_elem(procs_, &tgid);
  bump_version();
}

void UnwindMaps::bump_version() {
  // The kernel side bumps it too (an atomic add): so must this.
  std::atomic_ref<std::uint64_t>(*version_word_).fetch_add(1);
}

UnwindMaps::Usage UnwindMaps::usage() const {
  std::lock_guard lock(mutex_);
  Usage u;
  for (const auto& [file, t] : tables_) {
    u.rows += t.count;
    u.pages += t.pages.size();
  }
  for (const auto& r : retired_) u.rows_retired += r.count;
  u.rules = rule_index_.size();
  return u;
}

std::uint64_t UnwindMaps::kernel_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [name, fd] : maps()) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(fd));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("memlock:", 0) == 0) total += std::stoull(line.substr(8));
    }
  }
  return total;
}

}  // namespace ebpf_metricsd::profiling
