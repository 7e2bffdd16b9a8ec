#!/usr/bin/env bash
# Load on the web layer: wrk with C connections for D seconds against /metrics of a daemon
# with the shipped config's tracers. Prints requests/s, the count of each HTTP status, latency
# percentiles, and the daemon's RSS before, right after, and 30 s after the load; fails when
# that last one is more than 5 MiB above the start.
# Root; run from the repository root after building.
#   bash bench/load_bench.sh [connections] [seconds]
set -euo pipefail
conns=${1:-100}
secs=${2:-60}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 2; }
. "$(dirname "$0")/daemon.sh"
# wrk's connections all come from 127.0.0.1: the per-address limit makes room for them.
sed -e "s/listen_address: .*/listen_address: \"127.0.0.1:$port\"/" \
  -e "s/max_connections_per_address: .*/max_connections_per_address: $((conns + 10))/" \
  config/ebpf-metricsd.yaml >"$dir/config.yaml"
start_daemon "$dir/config.yaml"
sleep 6  # a drain or two, so that the exposition has its usual size
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
rss0=$(rss)
# Counts every response by status (wrk itself only reports "non-2xx").
cat >"$dir/status.lua" <<'LUA'
local counts = {}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for code, n in pairs(s) do total[code] = (total[code] or 0) + n end
  end
  local line = "statuses:"
  for code, n in pairs(total) do line = line .. " " .. code .. "=" .. n end
  print(line)
  io.write(string.format("latency p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n",
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
  io.write(string.format("errors: connect %d, read %d, write %d, timeout %d\n",
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
LUA
wrk -t2 -c"$conns" -d"${secs}s" --timeout 10s -s "$dir/status.lua" \
  "http://127.0.0.1:$port/metrics" | grep -E 'Requests/sec|statuses|latency|errors'
rss1=$(rss)
sleep 30
rss2=$(rss)
echo "daemon RSS: ${rss0} KiB before, ${rss1} KiB right after, ${rss2} KiB 30 s later"
kill -0 "$pid" && echo "daemon alive"
# The memory a burst took comes back: within 5 MiB of where it started.
if ((rss2 - rss0 > 5120)); then
  echo "FAIL: RSS 30 s after the load is $(((rss2 - rss0) / 1024)) MiB above the start" >&2
  exit 1
fi
