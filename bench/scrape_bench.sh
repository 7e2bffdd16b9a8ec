#!/usr/bin/env bash
# Scrape cost of a running daemon: every tracer of `--list-tracers` but the profile (whose
# stacks are served apart from /metrics) on, kmalloc by slab cache, runqueue_latency and
# offcpu_time labelled by comm; N scrapes of /metrics, plain and gzip. Prints series, bytes
# and latency percentiles, in the text and the protobuf format. Root; run from the repository
# root after building.
#   bash bench/scrape_bench.sh [scrapes]
set -euo pipefail
n=${1:-200}
. "$(dirname "$0")/daemon.sh"
options() {
  case $1 in
  runqueue_latency | offcpu_time) echo ", comm: true" ;;
  kmalloc) echo ", caches: true" ;;
  esac
}
{
  echo "web: {listen_address: \"127.0.0.1:$port\"}"
  echo "drain_interval: 1s"
  echo "tracers:"
  for t in $("$bin" --list-tracers); do
    [[ $t == profile ]] || echo "  $t: {enabled: true$(options "$t")}"
  done
} >"$dir/config.yaml"
start_daemon "$dir/config.yaml"
sleep 3  # a few drains, so that label sets have appeared
series=$(curl -s "$url" | grep -vc '^#')
proto='Accept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited'
for mode in text text+gzip protobuf protobuf+gzip; do
  hdr=()
  [[ $mode == protobuf* ]] && hdr+=(-H "$proto")
  [[ $mode == *gzip ]] && hdr+=(-H 'Accept-Encoding: gzip')
  bytes=$(curl -s "${hdr[@]}" "$url" | wc -c)
  for _ in $(seq "$n"); do curl -s "${hdr[@]}" -o /dev/null -w '%{time_total}\n' "$url"; done |
    sort -n | awk -v mode="$mode" -v bytes="$bytes" -v series="$series" '
      { t[NR] = $1 }
      END { printf "%-14s %6d samples %8d bytes  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms\n",
              mode, series, bytes, t[int(NR*0.5)]*1000, t[int(NR*0.9)]*1000, t[int(NR*0.99)]*1000 }'
done
echo "daemon RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$pid/status)"
