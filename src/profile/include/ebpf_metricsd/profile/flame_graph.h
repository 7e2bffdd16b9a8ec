#pragma once
// The flame graph page at /profile: a self-contained page (no network, no external script)
// that draws the last N seconds of profiles from /profile/data, on-CPU and off-CPU time
// coloured apart, with zoom and search, by process or by workload.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ebpf_metricsd/profile/profile_store.h"

namespace ebpf_metricsd::profiling {

// Under the root: a node per process ("comm (pid)"), per workload, per thread ("comm
// (tid)"), or none.
enum class FlameGrouping { Process, Workload, Thread, None };
std::optional<FlameGrouping> parse_flame_grouping(std::string_view text);

// Which time a view shows: on-CPU, off-CPU (blocked), or both in proportion (wall-clock).
enum class FlameView { OnCpu, OffCpu, Wall };
std::optional<FlameView> parse_flame_view(std::string_view text);
std::string_view flame_view_name(FlameView view);

// The system calls whose waits are idleness rather than delay: a thread waiting there waits
// for work (an event loop, a server's accept, a sleep, a parent's wait for its children, a
// condition variable or futex), by their names.
const std::vector<std::string_view>& idle_syscalls();
// Whether wait `s` (with the frames of its stack) is idle: in one of idle_syscalls(), or a
// kernel thread's (in no system call, no user frame on its stack).
bool idle_wait(const Sample& s, const std::vector<std::uint32_t>& stack,
               const std::vector<Frame>& frames);

// What a profile's view keeps: its time (`view`), and whether idle waits stay (`idle`: else
// they are set apart, their total said in the JSON); `base`, a window to compare it with
// (a differential flame graph), by the same rules.
struct FlameSelection {
  FlameView view = FlameView::Wall;
  bool idle = true;
  const ProfileWindow* base = nullptr;
};

// The window as a tree of frames, root first, as JSON:
//   {"seconds":S,"nodes":N,"pruned":P,"root":{"n":"all","on":ns,"off":ns,"c":[...]}}
// where each node is {"n":name,"m":module,"on":ns on CPU,"off":ns off CPU,"c":[children]}.
// Nodes beyond `max_nodes` are folded into their parents (their time stays there); `pruned`
// counts them.
// `slow_events`: the window holds slow events (their latency as off-CPU time), this many;
// the JSON then says "slow":N.
// A frame with source lines is a node per function inlined there (below the function it was
// inlined into); `lines`: nodes are named "function:line" where the line is known.
// `selection` (a profile's, not slow events'): the samples of its view, and "view":name,
// "idle":{"shown":bool,"ns":time,"waits":count} (the idle waits of the view, shown or set
// apart), "processes":[{"pid","comm","workload","on","off"}, ...] (the kMaxProcesses with the
// most time in the view, most first) and, for each thread of the window,
// "threads":[{"tid","pid","comm","on","off"}, ...] when grouped by thread. With a base window,
// every node has "b": the base window's time at that node (on and off, as the view keeps),
// and "base":{"seconds":S} (a node only the base has stays, of no width).
// "from_ms" and "to_ms": the window's bounds in Unix milliseconds.
std::string flame_graph_json(const ProfileWindow& window, FlameGrouping grouping,
                             std::size_t max_nodes, std::optional<std::size_t> slow_events = {},
                             bool lines = false, std::optional<FlameSelection> selection = {});
constexpr std::size_t kMaxProcesses = 20;

// The page itself.
std::string_view flame_graph_page();

}  // namespace ebpf_metricsd::profiling
