#include "ebpf_metricsd/bpf/hook_probe.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <memory>
#include <vector>

#include "ebpf_metricsd/bpf/bpf_support.h"

namespace ebpf_metricsd {

std::string_view hook_name(HookKind kind) {
  switch (kind) {
    case HookKind::TpBtf:
      return "tp_btf";
    case HookKind::RawTp:
      return "raw_tp";
    case HookKind::Fentry:
      return "fentry";
  }
  return "?";
}

std::optional<HookPreference> parse_hook_preference(std::string_view text) {
  if (text == "auto") return HookPreference::Auto;
  if (text == "tp_btf") return HookPreference::TpBtf;
  if (text == "raw_tp") return HookPreference::RawTp;
  return std::nullopt;
}

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// "return 0"
const bpf_insn kReturnZero[] = {
    {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .src_reg = 0, .off = 0, .imm = 0},
    {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},
};

std::string probe(HookKind kind, const std::string& tracepoint) {
  LIBBPF_OPTS(bpf_prog_load_opts, opts);
  bpf_prog_type type = BPF_PROG_TYPE_RAW_TRACEPOINT;
  if (kind == HookKind::Fentry) {
    const int btf_id = running_kernel_btf_id(tracepoint, BPF_TRACE_FENTRY);
    if (btf_id < 0) return bpf_error_text("no BTF for function " + tracepoint, btf_id);
    opts.expected_attach_type = BPF_TRACE_FENTRY;
    opts.attach_btf_id = static_cast<__u32>(btf_id);
    Fd prog(bpf_prog_load(BPF_PROG_TYPE_TRACING, "emd_probe", "GPL", kReturnZero, 2, &opts));
    if (prog.get() < 0) return bpf_error_text("load probe program", errno);
    Fd link(bpf_link_create(prog.get(), 0, BPF_TRACE_FENTRY, nullptr));
    if (link.get() < 0) return bpf_error_text("attach probe program", errno);
    return "";
  }
  if (kind == HookKind::TpBtf) {
    const int btf_id = running_kernel_btf_id(tracepoint, BPF_TRACE_RAW_TP);
    if (btf_id < 0) return bpf_error_text("no BTF for tracepoint " + tracepoint, btf_id);
    type = BPF_PROG_TYPE_TRACING;
    opts.expected_attach_type = BPF_TRACE_RAW_TP;
    opts.attach_btf_id = static_cast<__u32>(btf_id);
  }
  Fd prog(bpf_prog_load(type, "emd_probe", "GPL", kReturnZero, 2, &opts));
  if (prog.get() < 0) return bpf_error_text("load probe program", errno);
  Fd link(
      bpf_raw_tracepoint_open(kind == HookKind::TpBtf ? nullptr : tracepoint.c_str(), prog.get()));
  if (link.get() < 0) return bpf_error_text("attach probe program", errno);
  return "";
}

}  // namespace

namespace {

// The C spelling of a BTF type as far as telling arguments apart needs: "struct folio *",
// "size_t", "unsigned long". Qualifiers are dropped.
std::string type_spelling(const btf* b, __u32 id) {
  const btf_type* t = btf__type_by_id(b, id);
  while (t && (btf_is_const(t) || btf_is_volatile(t) || btf_is_restrict(t)))
    t = btf__type_by_id(b, t->type);
  if (!t) return "?";
  if (btf_is_ptr(t)) return type_spelling(b, t->type) + " *";
  const char* name = btf__name_by_offset(b, t->name_off);
  const std::string n = name ? name : "";
  if (btf_is_struct(t)) return "struct " + n;
  if (btf_is_union(t)) return "union " + n;
  if (btf_is_enum(t)) return "enum " + n;
  return n.empty() ? "?" : n;
}

}  // namespace

std::optional<std::vector<std::string>> tracepoint_arg_types(const std::string& tracepoint) {
  const auto vmlinux = kernel_btf();
  if (!vmlinux) return std::nullopt;
  const int id =
      btf__find_by_name_kind(vmlinux.get(), ("btf_trace_" + tracepoint).c_str(), BTF_KIND_TYPEDEF);
  if (id < 0) return std::nullopt;
  // typedef -> pointer -> function prototype (void *data, args...)
  const btf_type* t = btf__type_by_id(vmlinux.get(), static_cast<__u32>(id));
  t = t ? btf__type_by_id(vmlinux.get(), t->type) : nullptr;
  if (!t || !btf_is_ptr(t)) return std::nullopt;
  t = btf__type_by_id(vmlinux.get(), t->type);
  if (!t || !btf_is_func_proto(t)) return std::nullopt;
  std::vector<std::string> types;
  const btf_param* p = btf_params(t);
  for (unsigned i = 1; i < btf_vlen(t); ++i)
    types.push_back(type_spelling(vmlinux.get(), p[i].type));
  return types;
}

std::optional<int> tracepoint_arg_count(const std::string& tracepoint) {
  auto types = tracepoint_arg_types(tracepoint);
  if (!types) return std::nullopt;
  return static_cast<int>(types->size());
}

bool KernelHookProber::can_attach(HookKind kind, const std::string& tracepoint) {
  std::lock_guard lock(mutex_);
  auto key = std::make_pair(kind, tracepoint);
  auto it = results_.find(key);
  if (it == results_.end()) it = results_.emplace(key, probe(kind, tracepoint)).first;
  return it->second.empty();
}

std::string KernelHookProber::failure(HookKind kind, const std::string& tracepoint) const {
  std::lock_guard lock(mutex_);
  auto it = results_.find({kind, tracepoint});
  return it == results_.end() ? "" : it->second;
}

std::optional<HookKind> choose_hook(HookProber& prober, std::span<const std::string> tracepoints,
                                    HookPreference preference) {
  std::vector<HookKind> order;
  switch (preference) {
    case HookPreference::Auto:
      order = {HookKind::TpBtf, HookKind::RawTp};
      break;
    case HookPreference::TpBtf:
      order = {HookKind::TpBtf};
      break;
    case HookPreference::RawTp:
      order = {HookKind::RawTp};
      break;
  }
  for (HookKind kind : order) {
    bool all = true;
    for (const auto& tp : tracepoints) {
      if (!prober.can_attach(kind, tp)) {
        all = false;
        break;
      }
    }
    if (all) return kind;
  }
  return std::nullopt;
}

std::vector<HookKind> usable_hooks(HookProber& prober, std::span<const std::string> tracepoints,
                                   HookPreference preference) {
  std::vector<HookKind> kinds;
  for (HookKind kind : {HookKind::TpBtf, HookKind::RawTp}) {
    if (preference == HookPreference::TpBtf && kind != HookKind::TpBtf) continue;
    if (preference == HookPreference::RawTp && kind != HookKind::RawTp) continue;
    const HookPreference only =
        kind == HookKind::TpBtf ? HookPreference::TpBtf : HookPreference::RawTp;
    if (choose_hook(prober, tracepoints, only)) kinds.push_back(kind);
  }
  if (kinds.empty()) kinds.push_back(require_hook(prober, tracepoints, preference));
  return kinds;
}

HookKind start_first_loadable(const std::vector<HookKind>& kinds, const std::string& name,
                              const std::function<void(HookKind)>& start) {
  std::string why;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    try {
      start(kinds[i]);
      return kinds[i];
    } catch (const BpfError& e) {
      why += (why.empty() ? "" : "; ") + std::string(hook_name(kinds[i])) + ": " + e.what();
      if (i + 1 < kinds.size()) {
        spdlog::info("tracer {}: {} does not load here ({}), trying {}", name, hook_name(kinds[i]),
                     e.what(), hook_name(kinds[i + 1]));
      }
    }
  }
  throw BpfError(why);
}

HookKind require_hook(HookProber& prober, std::span<const std::string> tracepoints,
                      HookPreference preference) {
  if (auto kind = choose_hook(prober, tracepoints, preference)) return *kind;
  std::string why;
  for (HookKind kind : {HookKind::TpBtf, HookKind::RawTp}) {
    for (const auto& tp : tracepoints) {
      const std::string f = prober.failure(kind, tp);
      if (f.empty()) continue;
      if (!why.empty()) why += "; ";
      why.append(hook_name(kind)).append("/").append(tp).append(": ").append(f);
    }
  }
  throw BpfError("no usable hook" + (why.empty() ? std::string() : ": " + why));
}

}  // namespace ebpf_metricsd
