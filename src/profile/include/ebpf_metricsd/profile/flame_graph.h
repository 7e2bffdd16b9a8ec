#pragma once
// The flame graph page at /profile: a self-contained page (no network, no external script)
// that draws the last N seconds of profiles from /profile/data, on-CPU and off-CPU time
// coloured apart, with zoom and search, by process or by workload.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ebpf_metricsd/profile/profile_store.h"

namespace ebpf_metricsd::profiling {

enum class FlameGrouping { Process, Workload, None };
std::optional<FlameGrouping> parse_flame_grouping(std::string_view text);

// The window as a tree of frames, root first, as JSON:
//   {"seconds":S,"nodes":N,"pruned":P,"root":{"n":"all","on":ns,"off":ns,"c":[...]}}
// where each node is {"n":name,"m":module,"on":ns on CPU,"off":ns off CPU,"c":[children]}.
// Nodes beyond `max_nodes` are folded into their parents (their time stays there); `pruned`
// counts them.
// `slow_events`: the window holds slow events (their latency as off-CPU time), this many;
// the JSON then says "slow":N.
// A frame with source lines is a node per function inlined there (below the function it was
// inlined into); `lines`: nodes are named "function:line" where the line is known.
std::string flame_graph_json(const ProfileWindow& window, FlameGrouping grouping,
                             std::size_t max_nodes, std::optional<std::size_t> slow_events = {},
                             bool lines = false);

// The page itself.
std::string_view flame_graph_page();

}  // namespace ebpf_metricsd::profiling
