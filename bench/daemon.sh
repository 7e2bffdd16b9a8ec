# Sourced by the bench scripts: a scratch directory ($dir), a local port ($port, $url) and
# start_daemon CONFIG, which runs the built daemon ($EBPF_METRICSD or build/ebpf-metricsd)
# with it and waits until /metrics answers ($pid). Both are cleaned up on exit.
bin=${EBPF_METRICSD:-build/ebpf-metricsd}
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
url="http://127.0.0.1:$port/metrics"
pid=""
trap 'if [[ -n $pid ]]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi; rm -rf "$dir"' EXIT

start_daemon() {
  "$bin" --config "$1" 2>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do
    curl -sf "$url" -o /dev/null && return 0
    sleep 0.1
  done
  echo "the daemon does not answer on $url:" >&2
  cat "$dir/log" >&2
  return 1
}
