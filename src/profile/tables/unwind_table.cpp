#include "ebpf_metricsd/profile/unwind_table.h"

#include <dwarf.h>
#include <gelf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

namespace ebpf_metricsd::profiling {

std::string_view unwind_table_refusal_name(UnwindTableRefusal why) {
  switch (why) {
    case UnwindTableRefusal::NoCfi:
      return "no_cfi";
    case UnwindTableRefusal::BadCfi:
      return "bad_cfi";
    case UnwindTableRefusal::TooLarge:
      return "too_large";
    case UnwindTableRefusal::TooSlow:
      return "too_slow";
  }
  return "?";
}

emd_unwind_rule UnwindRule::kernel() const {
  emd_unwind_rule r{};
  r.kind = kind;
  r.fp = fp;
  r.plt_threshold = plt_threshold;
  r.cfa_offset = cfa_offset;
  r.fp_offset = fp_offset;
  r.ra_offset = ra_offset;
  return r;
}

namespace {

// DWARF register numbers of x86-64.
constexpr Dwarf_Word kRegFp = 6, kRegSp = 7;
constexpr int kRegRa = 16;

constexpr std::uint64_t kPageSize = std::uint64_t{1} << EMD_UNWIND_PAGE_BITS;

UnwindRule of_kind(std::uint8_t kind) {
  UnwindRule r;
  r.kind = kind;
  return r;
}

std::optional<std::int32_t> to_int32(Dwarf_Word v) {
  const auto s = static_cast<std::int64_t>(v);
  if (s < std::numeric_limits<std::int32_t>::min() || s > std::numeric_limits<std::int32_t>::max())
    return std::nullopt;
  return static_cast<std::int32_t>(s);
}

// A register saved at CFA + N: libdw's [DW_OP_call_frame_cfa] or [DW_OP_call_frame_cfa,
// DW_OP_plus_uconst N] (N as a two's complement word).
std::optional<std::int32_t> saved_at_cfa(const Dwarf_Op* ops, std::size_t n) {
  if (n == 1 && ops[0].atom == DW_OP_call_frame_cfa) return 0;
  if (n == 2 && ops[0].atom == DW_OP_call_frame_cfa && ops[1].atom == DW_OP_plus_uconst)
    return to_int32(ops[1].number);
  return std::nullopt;
}

// A register saved at rsp + N by an expression rule: [DW_OP_call_frame_cfa (pushed by libdw,
// unused), DW_OP_breg7 N].
std::optional<std::int32_t> saved_at_sp(const Dwarf_Op* ops, std::size_t n) {
  if (n == 2 && ops[0].atom == DW_OP_call_frame_cfa) {
    if (ops[1].atom == DW_OP_breg7) return to_int32(ops[1].number);
    if (ops[1].atom == DW_OP_bregx && ops[1].number == kRegSp) return to_int32(ops[1].number2);
  }
  return std::nullopt;
}

// The CFA of a PLT entry: rsp + N, plus 8 past the entry's push ((rip & 15) >= K):
// DW_OP_breg7 N; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litK; DW_OP_ge; DW_OP_lit3;
// DW_OP_shl; DW_OP_plus.
bool plt_cfa(const Dwarf_Op* ops, std::size_t n, UnwindRule& r) {
  if (n != 9 || ops[0].atom != DW_OP_breg7 || ops[1].atom != DW_OP_breg16 || ops[1].number != 0 ||
      ops[2].atom != DW_OP_lit15 || ops[3].atom != DW_OP_and || ops[4].atom < DW_OP_lit0 ||
      ops[4].atom > DW_OP_lit15 || ops[5].atom != DW_OP_ge || ops[6].atom != DW_OP_lit3 ||
      ops[7].atom != DW_OP_shl || ops[8].atom != DW_OP_plus)
    return false;
  const auto offset = to_int32(ops[0].number);
  if (!offset) return false;
  r.kind = EMD_UNWIND_PLT;
  r.cfa_offset = *offset;
  r.plt_threshold = static_cast<std::uint8_t>(ops[4].atom - DW_OP_lit0);
  return true;
}

// The rule libdw's interpreter found in `frame`.
UnwindRule classify(Dwarf_Frame* frame, bool signal) {
  Dwarf_Op ra_mem[3];
  Dwarf_Op* ra = nullptr;
  std::size_t nra = 0;
  if (dwarf_frame_register(frame, kRegRa, ra_mem, &ra, &nra) != 0)
    return of_kind(EMD_UNWIND_UNSUPPORTED);
  if (nra == 0 && ra != nullptr) return of_kind(EMD_UNWIND_END);  // undefined: the outermost
  Dwarf_Op* cfa = nullptr;
  std::size_t ncfa = 0;
  if (dwarf_frame_cfa(frame, &cfa, &ncfa) != 0 || ncfa == 0) return of_kind(EMD_UNWIND_UNSUPPORTED);
  Dwarf_Op fp_mem[3];
  Dwarf_Op* fp = nullptr;
  std::size_t nfp = 0;
  const bool fp_read =
      dwarf_frame_register(frame, static_cast<int>(kRegFp), fp_mem, &fp, &nfp) == 0;
  UnwindRule r;
  if (signal) {
    // The C library's signal return: CFA = *(rsp + X) (the interrupted rsp), rip and rbp
    // saved at rsp + Y and rsp + Z, in the ucontext the kernel pushed.
    if (ncfa == 2 && cfa[0].atom == DW_OP_breg7 && cfa[1].atom == DW_OP_deref && fp_read) {
      const auto x = to_int32(cfa[0].number);
      const auto y = saved_at_sp(ra, nra);
      const auto z = saved_at_sp(fp, nfp);
      if (x && y && z) {
        r.kind = EMD_UNWIND_SIGNAL;
        r.cfa_offset = *x;
        r.ra_offset = *y;
        r.fp_offset = *z;
        return r;
      }
    }
    return of_kind(EMD_UNWIND_UNSUPPORTED);
  }
  const auto ra_offset = saved_at_cfa(ra, nra);
  if (!ra_offset) return of_kind(EMD_UNWIND_UNSUPPORTED);
  r.ra_offset = *ra_offset;
  if (ncfa == 1 && cfa[0].atom == DW_OP_bregx &&
      (cfa[0].number == kRegSp || cfa[0].number == kRegFp)) {
    const auto offset = to_int32(cfa[0].number2);
    if (!offset) return of_kind(EMD_UNWIND_UNSUPPORTED);
    r.kind = cfa[0].number == kRegSp ? EMD_UNWIND_CFA_RSP : EMD_UNWIND_CFA_RBP;
    r.cfa_offset = *offset;
  } else if (!plt_cfa(cfa, ncfa, r)) {
    return of_kind(EMD_UNWIND_UNSUPPORTED);
  }
  // Undefined unless found: not read, marked undefined, or kept elsewhere (a register, an
  // expression), which is not followed; a caller whose CFA needs rbp ends the walk there.
  r.fp = EMD_UNWIND_FP_UNDEFINED;
  if (fp_read && nfp == 0 && fp == nullptr) {
    r.fp = EMD_UNWIND_FP_SAME;
  } else if (fp_read && nfp > 0) {
    if (const auto at = saved_at_cfa(fp, nfp)) {
      r.fp = EMD_UNWIND_FP_AT_CFA;
      r.fp_offset = *at;
    }
  }
  return r;
}

// A value of DWARF pointer-encoding format `format` (the low four bits of a DW_EH_PE_*
// encoding) at p, inside [p, end).
bool read_value(const std::uint8_t*& p, const std::uint8_t* end, std::uint8_t format,
                std::uint64_t& out) {
  const auto fixed = [&](std::size_t size, bool is_signed) {
    if (static_cast<std::size_t>(end - p) < size) return false;
    std::uint64_t v = 0;
    std::memcpy(&v, p, size);  // little-endian
    if (is_signed && size < 8 && ((v >> (size * 8 - 1)) & 1) != 0)
      v |= ~std::uint64_t{0} << (size * 8);
    p += size;
    out = v;
    return true;
  };
  const auto leb = [&](bool is_signed) {
    std::uint64_t v = 0;
    unsigned shift = 0;
    while (p < end) {
      const std::uint8_t b = *p++;
      if (shift < 64) v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) {
        if (is_signed && shift < 64 && (b & 0x40)) v |= ~std::uint64_t{0} << shift;
        out = v;
        return shift <= 70;  // at most ten bytes
      }
    }
    return false;
  };
  switch (format) {
    case DW_EH_PE_absptr:
    case DW_EH_PE_udata8:
    case DW_EH_PE_sdata8:
      return fixed(8, false);
    case DW_EH_PE_udata4:
      return fixed(4, false);
    case DW_EH_PE_sdata4:
      return fixed(4, true);
    case DW_EH_PE_udata2:
      return fixed(2, false);
    case DW_EH_PE_sdata2:
      return fixed(2, true);
    case DW_EH_PE_uleb128:
      return leb(false);
    case DW_EH_PE_sleb128:
      return leb(true);
    default:
      return false;
  }
}

// A pointer encoded as `enc` at p, whose own address is `here` (for pc-relative ones).
// Absolute and pc-relative pointers only: the others do not appear in a linked file's FDEs.
bool read_pointer(const std::uint8_t*& p, const std::uint8_t* end, std::uint8_t enc,
                  std::uint64_t here, std::uint64_t& out) {
  if (enc == DW_EH_PE_omit || (enc & DW_EH_PE_indirect)) return false;
  std::uint64_t v = 0;
  if (!read_value(p, end, enc & 0x0f, v)) return false;
  switch (enc & 0x70) {
    case DW_EH_PE_absptr:
      break;
    case DW_EH_PE_pcrel:
      v += here;
      break;
    default:
      return false;
  }
  out = v;
  return true;
}

// How a CIE's FDEs encode their addresses.
struct Cie {
  bool ok = false;
  std::uint8_t fde_encoding = DW_EH_PE_absptr;
};

Cie read_cie(const unsigned char* ident, Elf_Data* data, bool eh_frame, Dwarf_Off offset) {
  Cie c;
  Dwarf_CFI_Entry e;
  Dwarf_Off next = offset;
  if (dwarf_next_cfi(ident, data, eh_frame, offset, &next, &e) != 0 || !dwarf_cfi_cie_p(&e))
    return c;
  // dwarf_next_cfi found the string's NUL inside the entry.
  const char* aug = e.cie.augmentation;
  if (aug[0] == '\0') {
    c.ok = true;  // no augmentation: addresses as absolute pointers
    return c;
  }
  if (aug[0] != 'z' || e.cie.augmentation_data == nullptr) return c;
  const std::uint8_t* p = e.cie.augmentation_data;
  const std::uint8_t* end = p + e.cie.augmentation_data_size;
  for (const char* a = aug + 1; *a != '\0'; ++a) {
    switch (*a) {
      case 'R':
        if (p >= end) return c;
        c.fde_encoding = *p++;
        break;
      case 'L':  // the LSDA's encoding
        if (p >= end) return c;
        ++p;
        break;
      case 'P': {  // the personality routine: its encoding and pointer
        if (p >= end) return c;
        const std::uint8_t enc = *p++;
        std::uint64_t ignored = 0;
        if (!read_value(p, end, enc & 0x0f, ignored)) return c;
        break;
      }
      case 'S':  // a signal frame
      case 'B':  // branch target protection
        break;
      default:
        // Data of an unknown letter: where the encoding lies is not known past it.
        c.ok = std::strchr(a, 'R') == nullptr;
        return c;
    }
  }
  c.ok = true;
  return c;
}

struct Fde {
  std::uint64_t start = 0, end = 0;
};

enum class Listed { Ok, Bad, TooLarge };

// The FDEs of CFI section `scn` (.eh_frame or .debug_frame), in the order they stand.
Listed list_fdes(Elf* elf, Elf_Scn* scn, bool eh_frame, const UnwindTableLimits& limits,
                 std::vector<Fde>& out, std::size_t& bad) {
  GElf_Shdr shdr;
  Elf_Data* data = elf_getdata(scn, nullptr);
  const auto* ident = reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr));
  if (!gelf_getshdr(scn, &shdr) || !data || !data->d_buf || data->d_size == 0 || !ident)
    return Listed::Bad;
  const auto* base = static_cast<const std::uint8_t*>(data->d_buf);
  std::map<Dwarf_Off, Cie> cies;
  Dwarf_Off offset = 0;
  for (;;) {
    Dwarf_CFI_Entry e;
    Dwarf_Off next = offset;
    const int rc = dwarf_next_cfi(ident, data, eh_frame, offset, &next, &e);
    if (rc == 1) break;
    const bool advanced = next > offset && next != static_cast<Dwarf_Off>(-1);
    if (!advanced) {
      // An entry whose length cannot be read ends the section (a zero terminator too).
      if (out.empty() && rc != 0) return Listed::Bad;
      break;
    }
    offset = next;
    if (rc != 0) {
      ++bad;  // its length is known: skipped
      continue;
    }
    if (dwarf_cfi_cie_p(&e)) continue;
    if (out.size() >= limits.max_fdes || cies.size() >= limits.max_fdes) return Listed::TooLarge;
    auto [cie, fresh] = cies.try_emplace(e.fde.CIE_pointer);
    if (fresh) cie->second = read_cie(ident, data, eh_frame, e.fde.CIE_pointer);
    const std::uint8_t* p = e.fde.start;
    const std::uint8_t* end = e.fde.end;
    std::uint64_t start = 0, length = 0;
    const std::uint8_t enc = eh_frame ? cie->second.fde_encoding : std::uint8_t{DW_EH_PE_absptr};
    if (!cie->second.ok ||
        !read_pointer(p, end, enc, shdr.sh_addr + static_cast<std::uint64_t>(p - base), start) ||
        !read_value(p, end, enc & 0x0f, length) || start + length < start) {
      ++bad;
      continue;
    }
    if (length > 0) out.push_back({start, start + length});
  }
  return Listed::Ok;
}

Elf_Scn* section_named(Elf* elf, const char* name) {
  std::size_t strndx = 0;
  if (elf_getshdrstrndx(elf, &strndx) != 0) return nullptr;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (!gelf_getshdr(scn, &shdr) || shdr.sh_type == SHT_NOBITS) continue;
    const char* n = elf_strptr(elf, strndx, shdr.sh_name);
    if (n && std::strcmp(n, name) == 0) return scn;
  }
  return nullptr;
}

// Address ranges with their rule, in order, not overlapping; NONE where none lies.
struct Span {
  std::uint64_t start = 0, end = 0;
  UnwindRule rule;
};

struct Built {
  std::vector<Span> spans;
  std::size_t fdes = 0, bad = 0, unsupported = 0, rbp_fdes = 0;
};

std::optional<UnwindTableRefusal> interpret(Dwarf_CFI* cfi, std::vector<Fde> fdes,
                                            const UnwindTableLimits& limits, Built& b) {
  std::sort(fdes.begin(), fdes.end(), [](const Fde& x, const Fde& y) { return x.start < y.start; });
  const auto deadline = std::chrono::steady_clock::now() + limits.max_time;
  std::size_t rows = 0;
  std::uint64_t covered = 0;  // the end of the FDEs taken so far: an overlap goes to the first
  for (Fde f : fdes) {
    f.start = std::max(f.start, covered);
    if (f.start >= f.end) continue;
    covered = f.end;
    ++b.fdes;
    bool rbp = false;
    for (std::uint64_t a = f.start; a < f.end;) {
      if (++rows > limits.max_rows) return UnwindTableRefusal::TooLarge;
      if (rows % 1024 == 0 && std::chrono::steady_clock::now() > deadline)
        return UnwindTableRefusal::TooSlow;
      Dwarf_Frame* frame = nullptr;
      if (dwarf_cfi_addrframe(cfi, a, &frame) != 0) {
        ++b.bad;  // the rest of this FDE has no rule
        break;
      }
      Dwarf_Addr start = 0, end = 0;
      bool signal = false;
      const bool info = dwarf_frame_info(frame, &start, &end, &signal) >= 0;
      const UnwindRule rule = classify(frame, signal);
      std::free(frame);
      if (!info || start > a || end <= a) {
        ++b.bad;
        break;
      }
      end = std::min<std::uint64_t>(end, f.end);
      if (rule.kind == EMD_UNWIND_UNSUPPORTED) ++b.unsupported;
      rbp = rbp || rule.kind == EMD_UNWIND_CFA_RBP;
      if (!b.spans.empty() && b.spans.back().end == a && b.spans.back().rule == rule) {
        b.spans.back().end = end;
      } else {
        b.spans.push_back({a, end, rule});
      }
      a = end;
    }
    if (rbp) ++b.rbp_fdes;
  }
  return std::nullopt;
}

// Cuts the spans into pages of rows.
std::optional<UnwindTableRefusal> paginate(const std::vector<Span>& spans,
                                           const UnwindTableLimits& limits, UnwindTable& t) {
  std::map<UnwindRule, std::uint16_t> index;
  const auto rule_index = [&](const UnwindRule& r) -> std::optional<std::uint16_t> {
    auto it = index.find(r);
    if (it != index.end()) return it->second;
    if (t.rules.size() > std::numeric_limits<std::uint16_t>::max()) return std::nullopt;
    const auto i = static_cast<std::uint16_t>(t.rules.size());
    t.rules.push_back(r);
    index.emplace(r, i);
    return i;
  };
  // Where a rule starts, with NONE where a gap between spans starts, and after the last.
  std::vector<Span> starts;
  for (const Span& s : spans) {
    if (!starts.empty() && starts.back().end < s.start)
      starts.push_back({starts.back().end, s.start, UnwindRule{}});
    starts.push_back(s);
  }
  if (!starts.empty() && starts.back().end != 0)
    starts.push_back({starts.back().end, starts.back().end + 1, UnwindRule{}});
  const auto add_row = [&](std::uint64_t page, std::uint16_t lo, std::uint16_t rule) {
    if (t.pages.empty() || t.pages.back().page != page) {
      t.pages.push_back(
          {static_cast<std::uint32_t>(page), static_cast<std::uint32_t>(t.rows.size()), 0});
    }
    t.rows.push_back({lo, rule});
    ++t.pages.back().count;
  };
  for (const Span& s : starts) {
    const std::uint64_t first = s.start / kPageSize, last = (s.end - 1) / kPageSize;
    if (last > std::numeric_limits<std::uint32_t>::max()) return UnwindTableRefusal::TooLarge;
    if (s.rule.kind == EMD_UNWIND_NONE) {
      // Below a page's first row there is no rule: a NONE row is needed only to end the
      // rule before it in the same page.
      if (!t.pages.empty() && t.pages.back().page == first) {
        const auto i = rule_index(s.rule);
        if (!i) return UnwindTableRefusal::TooLarge;
        add_row(first, static_cast<std::uint16_t>(s.start % kPageSize), *i);
      }
      continue;
    }
    if (last - first >= limits.max_rows || t.rows.size() + (last - first) >= limits.max_rows)
      return UnwindTableRefusal::TooLarge;
    const auto i = rule_index(s.rule);
    if (!i) return UnwindTableRefusal::TooLarge;
    add_row(first, static_cast<std::uint16_t>(s.start % kPageSize), *i);
    for (std::uint64_t page = first + 1; page <= last; ++page) add_row(page, 0, *i);
  }
  return std::nullopt;
}

}  // namespace

UnwindRule UnwindTable::find(std::uint64_t addr) const {
  const std::uint64_t page = addr >> EMD_UNWIND_PAGE_BITS;
  auto p = std::lower_bound(pages.begin(), pages.end(), page,
                            [](const Page& x, std::uint64_t v) { return x.page < v; });
  if (p == pages.end() || p->page != page) return {};
  const auto lo = static_cast<std::uint16_t>(addr % kPageSize);
  const auto begin = rows.begin() + p->first, end = begin + p->count;
  auto r = std::upper_bound(begin, end, lo, [](std::uint16_t v, const Row& x) { return v < x.lo; });
  if (r == begin) return {};
  return rules[std::prev(r)->rule];
}

std::size_t UnwindTable::kernel_bytes() const {
  return rows.size() * sizeof(emd_unwind_row) +
         pages.size() * (sizeof(emd_unwind_page_key) + sizeof(emd_unwind_page));
}

UnwindRule unwind_rule_at(Dwarf_CFI* cfi, std::uint64_t addr) {
  Dwarf_Frame* frame = nullptr;
  if (dwarf_cfi_addrframe(cfi, addr, &frame) != 0) return {};
  Dwarf_Addr start = 0, end = 0;
  bool signal = false;
  UnwindRule r;
  if (dwarf_frame_info(frame, &start, &end, &signal) >= 0) r = classify(frame, signal);
  std::free(frame);
  return r;
}

std::optional<UnwindTable> build_unwind_table(const ElfFile& file, const UnwindTableLimits& limits,
                                              UnwindTableRefusal& why) {
  // A reference of its own to the checked file's Elf (elf_file.h).
  Elf* elf = elf_begin(file.fd(), ELF_C_READ, file.elf());
  if (!elf) {
    why = UnwindTableRefusal::BadCfi;
    return std::nullopt;
  }
  struct Release {
    Elf* elf;
    Dwarf* dwarf = nullptr;
    Dwarf_CFI* eh = nullptr;
    ~Release() {
      if (eh) dwarf_cfi_end(eh);
      if (dwarf) dwarf_end(dwarf);
      elf_end(elf);
    }
  } release{elf};
  UnwindTable t;
  std::vector<Fde> fdes;
  std::size_t bad = 0;
  Dwarf_CFI* cfi = nullptr;
  Listed listed = Listed::Ok;
  if (Elf_Scn* scn = section_named(elf, ".eh_frame")) {
    listed = list_fdes(elf, scn, true, limits, fdes, bad);
    if (listed == Listed::Ok && !fdes.empty()) cfi = release.eh = dwarf_getcfi_elf(elf);
  }
  if (!cfi && listed != Listed::TooLarge) {
    fdes.clear();
    if (Elf_Scn* scn = section_named(elf, ".debug_frame")) {
      listed = list_fdes(elf, scn, false, limits, fdes, bad);
      if (listed == Listed::Ok && !fdes.empty()) {
        release.dwarf = dwarf_begin_elf(elf, DWARF_C_READ, nullptr);
        cfi = release.dwarf ? dwarf_getcfi(release.dwarf) : nullptr;
        t.debug_frame = cfi != nullptr;
      }
    }
  }
  if (listed == Listed::TooLarge) {
    why = UnwindTableRefusal::TooLarge;
    return std::nullopt;
  }
  if (!cfi) {
    why = fdes.empty() && listed == Listed::Ok ? UnwindTableRefusal::NoCfi
                                               : UnwindTableRefusal::BadCfi;
    return std::nullopt;
  }
  Built b;
  b.bad = bad;
  if (auto refused = interpret(cfi, std::move(fdes), limits, b)) {
    why = *refused;
    return std::nullopt;
  }
  if (auto refused = paginate(b.spans, limits, t)) {
    why = *refused;
    return std::nullopt;
  }
  if (t.rows.empty()) {
    why = UnwindTableRefusal::NoCfi;
    return std::nullopt;
  }
  t.fdes = b.fdes;
  t.bad_fdes = b.bad;
  t.unsupported_rows = b.unsupported;
  // Compiled with frame pointers, most functions compute their CFA from rbp once it is set.
  t.frame_pointers = b.fdes > 0 && b.rbp_fdes * 2 >= b.fdes;
  return t;
}

}  // namespace ebpf_metricsd::profiling
