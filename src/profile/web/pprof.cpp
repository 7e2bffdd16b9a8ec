#include "ebpf_metricsd/profile/pprof.h"

#include <chrono>

#include <map>
#include <tuple>
#include <unordered_map>

#include "ebpf_metricsd/base/syscall_names.h"
#include "ebpf_metricsd/profile/slow_events.h"
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

// Frame i as location i + 1; one mapping per module (and build-id); one function per
// (name, module, source file). A frame with source lines has a Line per function inlined at
// its address, innermost first, then its own function (pprof's order); one without has its
// function alone, the module as its file.
void add_frames(perftools::profiles::Profile& p, Strings& s, const std::vector<Frame>& frames) {
  std::map<std::pair<std::string, std::string>, perftools::profiles::Mapping*> mappings;
  std::map<std::tuple<std::string, std::string, std::string>, std::uint64_t> functions;
  const auto function = [&](const std::string& name, const std::string& module,
                            const std::string& file) {
    auto [it, fresh] = functions.try_emplace({name, module, file}, functions.size() + 1);
    if (fresh) {
      auto* fn = p.add_function();
      fn->set_id(it->second);
      fn->set_name(s.index(name));
      fn->set_system_name(s.index(name));
      fn->set_filename(s.index(file));
    }
    return it->second;
  };
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const Frame& f = frames[i];
    auto& m = mappings[{f.module, f.build_id}];
    if (!m) {
      m = p.add_mapping();
      m->set_id(mappings.size());
      m->set_filename(s.index(f.module));
      m->set_build_id(s.index(f.build_id));
      m->set_has_functions(true);
    }
    if (f.address >= m->memory_limit()) m->set_memory_limit(f.address + 1);
    auto* loc = p.add_location();
    loc->set_id(i + 1);
    loc->set_mapping_id(m->id());
    loc->set_address(f.address);
    if (f.lines.empty()) {
      loc->add_line()->set_function_id(function(f.function, f.module, f.module));
      continue;
    }
    m->set_has_filenames(true);
    m->set_has_line_numbers(true);
    m->set_has_inline_frames(true);
    for (const SourceLine& l : f.lines) {
      auto* line = loc->add_line();
      line->set_function_id(function(l.function, f.module, l.file.empty() ? f.module : l.file));
      line->set_line(l.line);
    }
  }
}

void set_times(perftools::profiles::Profile& p, std::chrono::system_clock::time_point begin,
               std::chrono::nanoseconds duration) {
  p.set_time_nanos(
      std::chrono::duration_cast<std::chrono::nanoseconds>(begin.time_since_epoch()).count());
  p.set_duration_nanos(duration.count());
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
  set_times(p, w.wall_begin, std::chrono::duration_cast<std::chrono::nanoseconds>(w.end - w.begin));

  add_frames(p, s, w.frames);

  // Samples of the same thread, stack and kind across batches are one sample.
  using Key = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, SampleKind, std::int32_t,
                         std::string, std::string>;
  std::map<Key, std::pair<std::uint64_t, std::uint64_t>> merged;
  std::map<Key, const Sample*> first;
  for (const Sample& x : w.samples) {
    const Key k{x.pid, x.tid, x.stack, x.kind, x.syscall, x.comm, x.workload.cgroup};
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
    if (x.syscall >= 0) label(out, s, "syscall", syscall_name(x.syscall));
    label(out, s, "cgroup", x.workload.cgroup);
    label(out, s, "pod", x.workload.pod);
    label(out, s, "container", x.workload.container);
  }
  return p.SerializeAsString();
}

std::string pprof_slow(const SlowWindow& w) {
  perftools::profiles::Profile p;
  Strings s(p);
  value_type(p.add_sample_type(), s, "events", "count");
  value_type(p.add_sample_type(), s, "latency", "nanoseconds");
  p.set_default_sample_type(s.index("latency"));
  set_times(p, w.begin, std::chrono::duration_cast<std::chrono::nanoseconds>(w.end - w.begin));
  // The stacks' frames as one table; a stack as the location ids of its frames.
  std::vector<Frame> frames;
  std::map<Frame, std::uint64_t> frame_ids;
  std::map<std::uint64_t, std::vector<std::uint64_t>> locations;
  for (const auto& [id, stack] : w.stacks) {
    auto& loc = locations[id];
    for (const Frame& f : stack) {
      auto [it, fresh] = frame_ids.try_emplace(f, frames.size() + 1);
      if (fresh) frames.push_back(f);
      loc.push_back(it->second);
    }
  }
  add_frames(p, s, frames);
  // One sample per event: each is a moment someone waited for.
  for (const SlowEvent& e : w.events) {
    auto* out = p.add_sample();
    if (auto it = locations.find(e.stack_id); it != locations.end()) {
      for (std::uint64_t l : it->second) out->add_location_id(l);
    }
    out->add_value(1);
    out->add_value(static_cast<std::int64_t>(e.latency_ns));
    label(out, s, "metric", e.metric);
    for (const auto& [name, value] : e.series) label(out, s, name.c_str(), value);
    label(out, s, "stack_id", stack_id_text(e.stack_id));
    label(out, s, "stack", e.stack_at_start ? "at_start" : "at_return");
    number(out, s, "pid", e.pid);
    number(out, s, "tid", e.tid);
    label(out, s, "comm", e.comm);
    label(out, s, "cgroup", e.workload.cgroup);
    label(out, s, "pod", e.workload.pod);
    label(out, s, "container", e.workload.container);
  }
  return p.SerializeAsString();
}

}  // namespace ebpf_metricsd::profiling
