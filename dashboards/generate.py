#!/usr/bin/env python3
"""Writes dashboards/ebpf-metricsd.json, the Grafana dashboard of ebpf-metricsd.

Run from the repository root after changing it: python3 dashboards/generate.py
The quantile panels read the recording rules of packaging/prometheus/rules.yml.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'
# Series of the workloads chosen in the variable (only labelled ones: cgroup is set).
WSEL = SEL + ', cgroup=~"$workload"'
WORKLOAD = "instance, cgroup, pod, container"
RATE = "$__rate_interval"

panels = []
_next_id = [1]
_y = [0]


def _id():
    _next_id[0] += 1
    return _next_id[0]


def row(title, description):
    panels.append({
        "type": "row", "id": _id(), "title": title, "collapsed": False,
        "description": description,
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": _y[0]}, "panels": [],
    })
    _y[0] += 1


def _targets(queries):
    out = []
    for i, (expr, legend) in enumerate(queries):
        out.append({"datasource": DS, "expr": expr, "legendFormat": legend,
                    "refId": chr(ord("A") + i), "range": True})
    return out


def timeseries(title, queries, unit, x, w, description="", stack=False):
    panels.append({
        "type": "timeseries", "id": _id(), "title": title, "description": description,
        "datasource": DS, "targets": _targets(queries),
        "gridPos": {"h": 8, "w": w, "x": x, "y": _y[0]},
        "fieldConfig": {"defaults": {
            "unit": unit,
            "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                       "stacking": {"mode": "normal" if stack else "none"}},
        }, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    })


def heatmap(title, metric, x, w, description=""):
    # Target A reads the classic buckets, B the native histogram (Prometheus with native
    # histograms stores only that one): whichever the server has shows.
    classic = rate_by(metric + "_bucket", "le")
    native = f"sum(rate({metric}{{{SEL}}}[{RATE}]))"
    panels.append({
        "type": "heatmap", "id": _id(), "title": title, "description": description,
        "datasource": DS,
        # Exemplars: the slow events of tracers with `slow`, each with a stack_id that the
        # data source links to the daemon's flame graph of it (packaging/grafana/).
        "targets": [{"datasource": DS, "expr": classic, "format": "heatmap",
                     "legendFormat": "{{le}}", "refId": "A", "range": True,
                     "exemplar": metric.endswith("_seconds")},
                    {"datasource": DS, "expr": native, "format": "heatmap",
                     "refId": "B", "range": True}],
        "gridPos": {"h": 8, "w": w, "x": x, "y": _y[0]},
        "options": {"calculate": False, "cellGap": 1,
                    "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5,
                              "steps": 64},
                    "yAxis": {"unit": "s" if metric.endswith("_seconds") else "bytes"},
                    "tooltip": {"show": True, "yHistogram": True},
                    "rowsFrame": {"layout": "le"}},
        "fieldConfig": {"defaults": {}, "overrides": []},
    })


def table(title, queries, x, w, description=""):
    targets = _targets(queries)
    for t in targets:
        t["format"] = "table"
        t["instant"] = True
        t["range"] = False
    panels.append({
        "type": "table", "id": _id(), "title": title, "description": description,
        "datasource": DS, "targets": targets,
        "gridPos": {"h": 8, "w": w, "x": x, "y": _y[0]},
        "transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "__name__": True, "job": True}}}],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
    })


def next_line():
    _y[0] += 8


def rate_by(metric, by):
    """The per-second rate of a counter, summed by the given labels."""
    return f"sum by ({by}) (rate({metric}{{{SEL}}}[{RATE}]))"


def profile_links(metric, view):
    """Links of the last panel's series to the daemon that exported each (its instance label):
    its profile page over the panel's time range (what the daemon keeps of it; the page says
    when the range begins earlier), and its slow events of `metric` over that range."""
    page = "${scheme}://${__field.labels.instance}/profile?from=${__from}&to=${__to}"
    panels[-1]["fieldConfig"]["defaults"]["links"] = [
        {"title": "Profile of ${__field.labels.instance} over this range",
         "url": page + "&view=" + view, "targetBlank": True},
        {"title": "Slow events of ${__field.labels.instance} over this range",
         "url": page + "&slow=1&metric=" + metric, "targetBlank": True},
    ]


def quantiles(level, metric, legend):
    return [(f"{level}:{metric}:p50_rate5m{{{SEL}}}", f"p50 {legend}"),
            (f"{level}:{metric}:p99_rate5m{{{SEL}}}", f"p99 {legend}")]


# Status: is every tracer attached, is the daemon keeping up, is anything lost.
row("Status", "Which tracers run and with which hook, drain time, drops, series limits.")
table("Tracers", [(f"ebpf_metricsd_tracer_up{{{SEL}}}", "")], 0, 8,
      "1 = attached; hook is the attach type the kernel probe chose; 0 = failed (see log). "
      "An instance links to its flame graph page (/profile) and its last 30 s of pprof, "
      "for an instance whose profile tracer is up.")
# The instance column links to the daemon's own pages: Prometheus' instance label is the
# host:port it scrapes, and $scheme says whether that is served over TLS.
panels[-1]["fieldConfig"]["overrides"].append({
    "matcher": {"id": "byName", "options": "instance"},
    "properties": [{"id": "links", "value": [
        {"title": "Flame graph of ${__data.fields.instance}",
         "url": "${scheme}://${__data.fields.instance}/profile", "targetBlank": True},
        {"title": "pprof, 30 s, of ${__data.fields.instance}",
         "url": "${scheme}://${__data.fields.instance}/debug/pprof/profile?seconds=30",
         "targetBlank": True},
    ]}],
})
timeseries("Drain duration", [(f"ebpf_metricsd_drain_duration_seconds{{{SEL}}}",
                               "{{instance}} {{tracer}}")], "s", 8, 8,
           "How long reading each tracer's BPF maps took, per drain.")
timeseries("Dropped events and limited series", [
    (rate_by("ebpf_metricsd_dropped_events_total", "instance, tracer, reason"),
     "{{instance}} {{tracer}} {{reason}}"),
    (rate_by("ebpf_metricsd_series_limited_total", "instance, metric"),
     "{{instance}} limited {{metric}}"),
], "ops", 16, 8, "Events the kernel side could not record, and label sets refused by max_series.")
next_line()

row("Syscalls", "Time from syscall entry to exit.")
heatmap("Syscall latency", "ebpf_syscall_latency_seconds", 0, 6)
timeseries("Syscall latency p50 / p99, all syscalls",
           quantiles("instance", "ebpf_syscall_latency_seconds", "{{instance}}"), "s", 6, 6)
profile_links("ebpf_syscall_latency_seconds", "wall")
timeseries("Syscall latency p99, slowest 10", [
    (f"topk(10, instance_syscall:ebpf_syscall_latency_seconds:p99_rate5m{{{SEL}}})",
     "{{instance}} {{syscall}}")], "s", 12, 6)
timeseries("Syscalls per second, top 10", [
    (f"topk(10, instance_syscall:ebpf_syscall_latency_seconds_count:rate5m{{{SEL}}})",
     "{{instance}} {{syscall}}")], "ops", 18, 6)
next_line()

row("TCP connect", "Active opens: SYN sent until established, and failed connects.")
heatmap("Connect latency", "ebpf_tcp_connect_latency_seconds", 0, 8)
timeseries("Connect latency p50 / p99",
           quantiles("instance_family", "ebpf_tcp_connect_latency_seconds",
                     "{{instance}} {{family}}"), "s", 8, 8)
profile_links("ebpf_tcp_connect_latency_seconds", "off")
timeseries("Connects and failures per second", [
    (f"instance_family:ebpf_tcp_connect_latency_seconds_count:rate5m{{{SEL}}}",
     "established {{instance}} {{family}}"),
    (rate_by("ebpf_tcp_connect_failures_total", "instance, family"),
     "failed {{instance}} {{family}}")], "ops", 16, 8)
next_line()

row("Network transmit", "Packets from being queued for a device to the driver taking them.")
heatmap("Queue-to-transmit latency", "ebpf_net_xmit_queue_latency_seconds", 0, 8)
timeseries("Queue-to-transmit latency p50 / p99 by interface",
           quantiles("instance_interface", "ebpf_net_xmit_queue_latency_seconds",
                     "{{instance}} {{interface}}"), "s", 8, 8)
profile_links("ebpf_net_xmit_queue_latency_seconds", "on")
timeseries("Transmitted bytes per second by interface", [
    (rate_by("ebpf_net_xmit_bytes_total", "instance, interface"),
     "{{instance}} {{interface}}")], "Bps", 16, 8)
next_line()

row("Scheduler", "Run-queue latency (waiting for a CPU) and off-CPU time (blocked).")
heatmap("Run-queue latency", "ebpf_runqueue_latency_seconds", 0, 6)
timeseries("Run-queue latency p50 / p99",
           quantiles("instance", "ebpf_runqueue_latency_seconds", "{{instance}}"), "s", 6, 6,
           "p99 above 50 ms raises RunqueueLatencyHigh.")
profile_links("ebpf_runqueue_latency_seconds", "on")
heatmap("Off-CPU time", "ebpf_offcpu_seconds", 12, 6)
timeseries("Off-CPU time p50 / p99",
           quantiles("instance", "ebpf_offcpu_seconds", "{{instance}}"), "s", 18, 6)
profile_links("ebpf_offcpu_seconds", "off")
next_line()
timeseries("Context switches per second", [
    (rate_by("ebpf_context_switches_total", "instance, kind"),
     "{{instance}} {{kind}}")], "ops", 0, 12,
           "voluntary: the task blocked; involuntary: it was preempted while runnable.")
next_line()

row("Memory", "Page faults and kernel allocations.")
timeseries("Page faults per second", [
    (rate_by("ebpf_page_faults_total", "instance, type"),
     "{{instance}} {{type}}")], "ops", 0, 8)
timeseries("kmalloc bytes per second", [
    (rate_by("ebpf_kmalloc_bytes_total", "instance, kind"),
     "{{instance}} {{kind}}")], "Bps", 8, 8,
           "requested: asked of kmalloc; allocated: rounded up to the slab size.")
heatmap("kmalloc request sizes", "ebpf_kmalloc_size_bytes", 16, 8)
next_line()

row("Page cache", "Page cache accesses, misses (pages added, readahead included), hit ratio.")
timeseries("Hit ratio", [(f"instance:ebpf_page_cache_hit_ratio:rate5m{{{SEL}}}", "{{instance}}")],
           "percentunit", 0, 8, "1 - misses / accesses over 5 minutes.")
timeseries("Accesses and misses per second", [
    (rate_by("ebpf_page_cache_accesses_total", "instance"),
     "accesses {{instance}}"),
    (rate_by("ebpf_page_cache_misses_total", "instance"),
     "misses {{instance}}")], "ops", 8, 8)
timeseries("Pages dirtied per second", [
    (rate_by("ebpf_page_cache_dirtied_total", "instance"),
     "{{instance}}")], "ops", 16, 8)
next_line()

row("Block I/O", "Requests from issue to the device until completion, by device and op.")
heatmap("Block I/O latency", "ebpf_block_io_latency_seconds", 0, 8)
timeseries("Latency p50 / p99 by device and op",
           quantiles("instance_device_op", "ebpf_block_io_latency_seconds",
                     "{{instance}} {{device}} {{op}}"), "s", 8, 8)
profile_links("ebpf_block_io_latency_seconds", "off")
timeseries("IOPS and throughput by device and op", [
    (f"instance_device_op:ebpf_block_io_latency_seconds_count:rate5m{{{SEL}}}",
     "IOPS {{instance}} {{device}} {{op}}"),
    (rate_by("ebpf_block_io_bytes_total", "instance, device, op"),
     "B/s {{instance}} {{device}} {{op}}")], "short", 16, 8)
next_line()

row("Workloads", "Where a tracer has cgroup: true (OOM kills always): the busiest cgroups. "
    "cgroup is the systemd unit or the cgroup path; under Kubernetes pod is the pod UID "
    "(kube_pod_info's uid) and container the container ID.")


def top_rate(metric, legend_unit=""):
    return [(f"topk(10, {rate_by_workload(metric)})",
             "{{instance}} {{cgroup}} {{pod}} {{container}}" + legend_unit)]


def rate_by_workload(metric):
    return f"sum by ({WORKLOAD}) (rate({metric}{{{WSEL}}}[{RATE}]))"


def top_histogram(metric, fn):
    """Top 10 workloads by the rate of a histogram's sum or count, classic or native."""
    classic = rate_by_workload(f"{metric}_{fn}")
    native = f"sum by ({WORKLOAD}) (histogram_{fn}(rate({metric}{{{WSEL}}}[{RATE}])))"
    return [(f"topk(10, {classic} or {native})", "{{instance}} {{cgroup}} {{pod}} {{container}}")]


timeseries("Syscall time by workload, top 10",
           top_histogram("ebpf_syscall_latency_seconds", "sum"), "s", 0, 8,
           "Seconds spent in syscalls per second (1 = one thread always in a syscall).")
timeseries("Run-queue wait by workload, top 10",
           top_histogram("ebpf_runqueue_latency_seconds", "sum"), "s", 8, 8,
           "Seconds spent runnable but waiting for a CPU, per second.")
timeseries("TCP connects by workload, top 10",
           top_histogram("ebpf_tcp_connect_latency_seconds", "count"), "ops", 16, 8)
next_line()
timeseries("Page faults by workload, top 10", top_rate("ebpf_page_faults_total"), "ops", 0, 8)
timeseries("Page cache misses by workload, top 10",
           top_rate("ebpf_page_cache_misses_total"), "ops", 8, 8)
timeseries("Block I/O bytes by workload, top 10",
           top_rate("ebpf_block_io_bytes_total"), "Bps", 16, 8,
           "By the cgroup each request is charged to (the writer of dirty pages).")
next_line()
timeseries("Packets sent by workload, top 10",
           top_rate("ebpf_net_xmit_packets_total"), "pps", 0, 8,
           "By the cgroup of the sending socket.")
timeseries("OOM kills by workload, last hour", [
    # A kill usually makes a new series whose first sample is already 1, which increase()
    # would not count: the value now minus an hour ago, or all of it for a newer series.
    (f"sum by ({WORKLOAD}) ((ebpf_oom_kills_total{{{WSEL}}} - ebpf_oom_kills_total{{{WSEL}}} "
     f"offset 1h) or (ebpf_oom_kills_total{{{WSEL}}} unless ebpf_oom_kills_total{{{WSEL}}} "
     f"offset 1h))",
     "{{instance}} {{cgroup}} {{pod}} {{container}}")], "short", 8, 16,
           "Processes the OOM killer chose, by the victim's cgroup.")
next_line()

dashboard = {
    "__inputs": [],
    "__requires": [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ],
    "uid": "ebpf-metricsd",
    "title": "ebpf-metricsd",
    "description": "Kernel latencies and counts from the eBPF tracers of ebpf-metricsd.",
    "tags": ["ebpf", "ebpf-metricsd", "linux"],
    "schemaVersion": 39,
    "version": 1,
    "editable": True,
    "graphTooltip": 1,
    "time": {"from": "now-1h", "to": "now"},
    "refresh": "30s",
    "timezone": "",
    "links": [],
    "annotations": {"list": []},
    "templating": {"list": [
        {"type": "datasource", "name": "datasource", "label": "Data source",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
         "options": []},
        {"type": "query", "name": "instance", "label": "Instance", "datasource": DS,
         "definition": "label_values(ebpf_metricsd_build_info, instance)",
         "query": {"query": "label_values(ebpf_metricsd_build_info, instance)",
                   "refId": "instance"},
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+",
         "current": {}, "hide": 0, "sort": 1, "regex": "", "options": []},
        {"type": "query", "name": "workload", "label": "Workload (cgroup)", "datasource": DS,
         "definition": f'label_values({{__name__=~"ebpf_.+", {SEL}}}, cgroup)',
         "query": {"query": f'label_values({{__name__=~"ebpf_.+", {SEL}}}, cgroup)',
                   "refId": "workload"},
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+",
         "current": {}, "hide": 0, "sort": 1, "regex": "", "options": []},
        {"type": "custom", "name": "scheme", "label": "Daemon pages over",
         "description": "The scheme of links to the daemons' own pages (flame graphs): "
                        "https where web.config.file sets TLS.",
         "query": "http,https", "current": {"text": "http", "value": "http"},
         "options": [{"text": "http", "value": "http", "selected": True},
                     {"text": "https", "value": "https", "selected": False}],
         "multi": False, "includeAll": False, "hide": 0},
    ]},
    "panels": panels,
}

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ebpf-metricsd.json")
with open(path, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
