#include "ebpf_metricsd/profile/flame_graph.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <tuple>

#include "ebpf_metricsd/base/syscall_names.h"

namespace ebpf_metricsd::profiling {

std::optional<FlameGrouping> parse_flame_grouping(std::string_view text) {
  if (text == "process") return FlameGrouping::Process;
  if (text == "workload") return FlameGrouping::Workload;
  if (text == "thread") return FlameGrouping::Thread;
  if (text == "none") return FlameGrouping::None;
  return std::nullopt;
}

std::optional<FlameView> parse_flame_view(std::string_view text) {
  if (text == "on") return FlameView::OnCpu;
  if (text == "off") return FlameView::OffCpu;
  if (text == "wall") return FlameView::Wall;
  return std::nullopt;
}

std::string_view flame_view_name(FlameView view) {
  switch (view) {
    case FlameView::OnCpu:
      return "on";
    case FlameView::OffCpu:
      return "off";
    case FlameView::Wall:
      break;
  }
  return "wall";
}

const std::vector<std::string_view>& idle_syscalls() {
  static const std::vector<std::string_view> names = {
      "epoll_wait",    "epoll_pwait",     "epoll_pwait2",    "poll",
      "ppoll",         "select",          "pselect6",        "futex",
      "futex_waitv",   "nanosleep",       "clock_nanosleep", "pause",
      "rt_sigsuspend", "rt_sigtimedwait", "wait4",           "waitid",
      "accept",        "accept4"};
  return names;
}

bool idle_wait(const Sample& s, const std::vector<std::uint32_t>& stack,
               const std::vector<Frame>& frames) {
  static const std::set<int> numbers = [] {
    std::set<int> n;
    for (const std::string_view name : idle_syscalls()) {
      if (const auto nr = syscall_number(std::string(name))) n.insert(*nr);
    }
    return n;
  }();
  if (s.kind != SampleKind::OffCpu) return false;
  if (s.syscall >= 0) return numbers.contains(s.syscall);
  return !stack.empty() && std::none_of(stack.begin(), stack.end(),
                                        [&](std::uint32_t f) { return !frames[f].kernel; });
}

namespace {

struct Node {
  std::string name, module;
  std::uint64_t on = 0, off = 0;
  std::uint64_t base = 0;  // a base window's time (a differential flame graph)
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Node>> children;
  bool keep = false;
  // The child of that name, made when `room` allows (nullptr when it does not).
  Node* child(const std::string& child_name, const std::string& child_module, std::size_t& room) {
    const auto key = std::make_pair(child_name, child_module);
    if (auto it = children.find(key); it != children.end()) return it->second.get();
    if (room == 0) return nullptr;
    --room;
    auto& c = children[key];
    c = std::make_unique<Node>();
    c->name = child_name;
    c->module = child_module;
    return c.get();
  }
};

std::string group_of(const Sample& s, FlameGrouping g) {
  switch (g) {
    case FlameGrouping::Process:
      return s.comm + " (" + std::to_string(s.pid) + ")";
    case FlameGrouping::Workload:
      return s.workload.cgroup.empty() ? "(cgroup labels off)" : s.workload.cgroup;
    case FlameGrouping::Thread:
      return s.comm + " (" + std::to_string(s.tid) + ")";
    case FlameGrouping::None:
      break;
  }
  return {};
}

// `base`: with the base window's time ("b").
nlohmann::json to_json(const Node& n, bool base) {
  nlohmann::json j = {{"n", n.name}, {"on", n.on}, {"off", n.off}};
  if (base) j["b"] = n.base;
  if (!n.module.empty()) j["m"] = n.module;
  nlohmann::json children = nlohmann::json::array();
  for (const auto& [key, c] : n.children) {
    if (c->keep) children.push_back(to_json(*c, base));
  }
  if (!children.empty()) j["c"] = std::move(children);
  return j;
}

void count_all(const Node& n, std::size_t& total) {
  ++total;
  for (const auto& [key, c] : n.children) count_all(*c, total);
}

}  // namespace

namespace {

// Time of a process or thread in a window.
struct Times {
  std::uint32_t pid = 0;
  std::string comm, workload;
  std::uint64_t on = 0, off = 0;
  std::optional<std::uint64_t> runq;  // runnable, waiting for a CPU (the kernel's accounting)
};

nlohmann::json times_json(const std::map<std::uint32_t, Times>& by_id, const char* id,
                          std::size_t max) {
  std::vector<std::pair<std::uint32_t, const Times*>> most;
  most.reserve(by_id.size());
  for (const auto& [key, t] : by_id) most.emplace_back(key, &t);
  std::stable_sort(most.begin(), most.end(), [](const auto& a, const auto& b) {
    return a.second->on + a.second->off > b.second->on + b.second->off;
  });
  if (most.size() > max) most.resize(max);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, t] : most) {
    nlohmann::json j = {{id, key}, {"comm", t->comm}, {"on", t->on}, {"off", t->off}};
    if (std::string_view(id) == "tid") j["pid"] = t->pid;
    if (t->runq) j["runq"] = *t->runq;
    if (!t->workload.empty()) j["workload"] = t->workload;
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

std::string flame_graph_json(const ProfileWindow& w, FlameGrouping grouping, std::size_t max_nodes,
                             std::optional<std::size_t> slow_events, bool lines,
                             std::optional<FlameSelection> selection) {
  Node root;
  root.name = "all";
  // The tree is built within ten times the nodes sent: past that, a stack's deeper frames
  // stay in the last node made (their time is kept there).
  std::size_t room = 10 * max_nodes;
  const FlameSelection select = selection.value_or(FlameSelection{});
  std::uint64_t idle_ns = 0, idle_waits = 0;
  std::map<std::uint32_t, Times> processes, threads;
  // The samples of window `win` into the tree: the window shown, or (`base`) the one it is
  // compared with, whose time goes to the nodes' `base`.
  const auto add_window = [&](const ProfileWindow& win, bool base) {
    for (const Sample& s : win.samples) {
      const bool on = s.kind == SampleKind::OnCpu;
      if (selection) {
        if (!base) {
          // Every thread's time, whatever the view.
          Times& t = threads[s.tid];
          t.pid = s.pid;
          t.comm = s.comm;
          (on ? t.on : t.off) += s.ns;
        }
        if (select.view == (on ? FlameView::OffCpu : FlameView::OnCpu)) continue;
        if (!on && idle_wait(s, win.stacks[s.stack], win.frames)) {
          if (!base) {
            idle_ns += s.ns;
            idle_waits += s.count;
          }
          if (!select.idle) continue;
        }
        if (!base) {
          // A process by its main thread's name where it has time, else its first thread's.
          Times& p = processes[s.pid];
          if (p.comm.empty() || s.tid == s.pid) p.comm = s.comm;
          p.workload = s.workload.cgroup;
          (on ? p.on : p.off) += s.ns;
        }
      }
      Node* n = &root;
      const auto add = [&](Node* x) { (base ? x->base : on ? x->on : x->off) += s.ns; };
      add(n);
      if (grouping != FlameGrouping::None) {
        Node* g = n->child(group_of(s, grouping), "", room);
        if (!g) continue;
        n = g;
        add(n);
      }
      const auto& frames = win.stacks[s.stack];
      // Root first: a frame's own function, then the functions inlined into it, outermost
      // first; with `lines`, each named with its line.
      const auto step = [&](const std::string& function, std::uint32_t line,
                            const std::string& module) {
        Node* c = n->child(lines && line ? function + ":" + std::to_string(line) : function, module,
                           room);
        if (!c) return false;
        n = c;
        add(n);
        return true;
      };
      for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
        const Frame& f = win.frames[*it];
        bool ok = true;
        if (f.lines.empty()) ok = step(f.function, 0, f.module);
        for (auto l = f.lines.rbegin(); ok && l != f.lines.rend(); ++l)
          ok = step(l->function, l->line, f.module);
        if (!ok) break;
      }
    }
  };
  add_window(w, false);
  if (select.base) add_window(*select.base, true);
  // Each thread's on-CPU time from the scheduler's accounting where the window has it (not
  // from the samples), and its time runnable, waiting for a CPU.
  if (selection && w.accounted) {
    for (auto& [tid, t] : threads) t.on = 0;
    for (const ThreadTime& a : w.threads) {
      Times& t = threads[a.tid];
      if (t.comm.empty()) {
        t.pid = a.pid;
        t.comm = a.comm;
      }
      t.on = a.on_cpu_ns;
      t.runq = a.run_delay_ns;
    }
  }
  // Keep the heaviest nodes, parents before children, up to max_nodes (by the time shown;
  // a node only the base window has comes last).
  const auto weight = [](const Node* n) { return std::make_pair(n->on + n->off, n->base); };
  const auto lighter = [&](const Node* a, const Node* b) { return weight(a) < weight(b); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(lighter)> next(lighter);
  root.keep = true;
  std::size_t kept = 1;
  for (auto& [key, c] : root.children) next.push(c.get());
  while (!next.empty() && kept < max_nodes) {
    Node* n = next.top();
    next.pop();
    n->keep = true;
    ++kept;
    for (auto& [key, c] : n->children) next.push(c.get());
  }
  std::size_t total = 0;
  count_all(root, total);
  const auto unix_ms = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  };
  const auto seconds = [](const ProfileWindow& win) {
    return std::chrono::duration<double>(win.end - win.begin).count();
  };
  nlohmann::json j;
  j["seconds"] = seconds(w);
  j["from_ms"] = unix_ms(w.wall_begin);
  j["to_ms"] =
      unix_ms(w.wall_begin +
              std::chrono::duration_cast<std::chrono::system_clock::duration>(w.end - w.begin));
  j["kept_from_ms"] = unix_ms(w.wall_kept_from);
  j["kept_s"] = w.kept_for.count();
  j["root"] = to_json(root, select.base != nullptr);
  j["nodes"] = kept;
  j["pruned"] = total - kept;
  if (slow_events) j["slow"] = *slow_events;
  if (selection) {
    j["view"] = flame_view_name(select.view);
    j["idle"] = {{"shown", select.idle},
                 {"ns", idle_ns},
                 {"waits", idle_waits},
                 {"syscalls", idle_syscalls()}};
    j["processes"] = times_json(processes, "pid", kMaxProcesses);
    if (grouping == FlameGrouping::Thread) {
      j["threads"] = times_json(threads, "tid", max_nodes);
      j["threads_exact"] = w.accounted;
    }
    if (select.base) {
      j["base"] = {{"seconds", seconds(*select.base)},
                   {"from_ms", unix_ms(select.base->wall_begin)}};
    }
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ebpf_metricsd::profiling
