#include "ebpf_metricsd/profile/pprof.h"

#include <map>
#include <tuple>
#include <unordered_map>

#include "profile.pb.h"

namespace ebpf_metricsd::profiling {

namespace {

class Strings {
 public:
  explicit Strings(perftools::profiles::Profile& p) : p_(p) { index(""); }
  std::int64_t index(const std::string& s) {
    auto [it, fresh] = ids_.try_emplace(s, static_cast<std::int64_t>(ids_.size()));
    if (fresh) p_.add_string_table(s);
    return it->second;
  }

 private:
  perftools::profiles::Profile& p_;
  std::unordered_map<std::string, std::int64_t> ids_;
};

void value_type(perftools::profiles::ValueType* v, Strings& s, const char* type, const char* unit) {
  v->set_type(s.index(type));
  v->set_unit(s.index(unit));
}

void label(perftools::profiles::Sample* sample, Strings& s, const char* key,
           const std::string& value) {
  if (value.empty()) return;
  auto* l = sample->add_label();
  l->set_key(s.index(key));
  l->set_str(s.index(value));
}

void number(perftools::profiles::Sample* sample, Strings& s, const char* key, std::int64_t n) {
  auto* l = sample->add_label();
  l->set_key(s.index(key));
  l->set_num(n);
}

}  // namespace

std::string pprof_profile(const ProfileWindow& w) {
  perftools::profiles::Profile p;
  Strings s(p);
  value_type(p.add_sample_type(), s, "samples", "count");
  value_type(p.add_sample_type(), s, "cpu", "nanoseconds");
  value_type(p.add_sample_type(), s, "off_cpu", "nanoseconds");
  value_type(p.mutable_period_type(), s, "cpu", "nanoseconds");
  p.set_period(w.frequency ? 1000000000 / w.frequency : 0);
  p.set_default_sample_type(s.index("cpu"));
  p.set_time_nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       w.wall_begin.time_since_epoch())
                       .count());
  p.set_duration_nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(w.end - w.begin).count());

  // One mapping per module (and build-id); one function per (name, module).
  std::map<std::pair<std::string, std::string>, perftools::profiles::Mapping*> mappings;
  std::map<std::pair<std::string, std::string>, std::uint64_t> functions;
  for (std::size_t i = 0; i < w.frames.size(); ++i) {
    const Frame& f = w.frames[i];
    auto& m = mappings[{f.module, f.build_id}];
    if (!m) {
      m = p.add_mapping();
      m->set_id(mappings.size());
      m->set_filename(s.index(f.module));
      m->set_build_id(s.index(f.build_id));
      m->set_has_functions(true);
    }
    if (f.address >= m->memory_limit()) m->set_memory_limit(f.address + 1);
    auto [fit, fresh] = functions.try_emplace({f.function, f.module}, functions.size() + 1);
    if (fresh) {
      auto* fn = p.add_function();
      fn->set_id(fit->second);
      fn->set_name(s.index(f.function));
      fn->set_system_name(s.index(f.function));
      fn->set_filename(s.index(f.module));
    }
    auto* loc = p.add_location();
    loc->set_id(i + 1);
    loc->set_mapping_id(m->id());
    loc->set_address(f.address);
    loc->add_line()->set_function_id(fit->second);
  }

  // Samples of the same thread, stack and kind across batches are one sample.
  using Key = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, SampleKind, std::string,
                         std::string>;
  std::map<Key, std::pair<std::uint64_t, std::uint64_t>> merged;
  std::map<Key, const Sample*> first;
  for (const Sample& x : w.samples) {
    const Key k{x.pid, x.tid, x.stack, x.kind, x.comm, x.workload.cgroup};
    auto& v = merged[k];
    v.first += x.count;
    v.second += x.ns;
    first.try_emplace(k, &x);
  }
  for (const auto& [k, v] : merged) {
    const Sample& x = *first.at(k);
    auto* out = p.add_sample();
    for (std::uint32_t f : w.stacks[x.stack]) out->add_location_id(f + 1);
    const bool on = x.kind == SampleKind::OnCpu;
    out->add_value(static_cast<std::int64_t>(v.first));
    out->add_value(on ? static_cast<std::int64_t>(v.second) : 0);
    out->add_value(on ? 0 : static_cast<std::int64_t>(v.second));
    number(out, s, "pid", x.pid);
    number(out, s, "tid", x.tid);
    label(out, s, "comm", x.comm);
    label(out, s, "state", on ? "on_cpu" : "off_cpu");
    label(out, s, "cgroup", x.workload.cgroup);
    label(out, s, "pod", x.workload.pod);
    label(out, s, "container", x.workload.container);
  }
  return p.SerializeAsString();
}

}  // namespace ebpf_metricsd::profiling
