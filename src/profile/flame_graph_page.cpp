#include "ebpf_metricsd/profile/flame_graph.h"

namespace ebpf_metricsd::profiling {

namespace {

// One file, no external script or style: the page must work on a host with no network.
constexpr std::string_view kPage = R"PAGE(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ebpf-metricsd: profile</title>
<style>
body{font-family:sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.4em;margin:.2em 0}
form{margin:.6em 0}
form>*{margin-right:.6em}
#legend span{display:inline-block;padding:0 .6em;margin-right:.4em;border-radius:3px}
#legend .on{background:hsl(30,85%,62%)}
#legend .off{background:hsl(210,65%,68%)}
#graph{position:relative;width:100%;overflow:hidden;margin-top:.6em}
.f{position:absolute;height:17px;line-height:17px;font:12px monospace;overflow:hidden;
white-space:nowrap;box-sizing:border-box;border-right:1px solid #fff;padding-left:3px;
cursor:pointer}
.f:hover,.f:focus{filter:brightness(.9)}
.f:focus{outline:2px solid #222;outline-offset:-2px}
.f.match{background:hsl(300,70%,70%)!important}
#status{color:#555}
#idle-rule,#diff-legend,#kept{color:#555;font-size:.9em;margin:.3em 0}
#kept:empty{display:none}
.grew{background:hsl(0,80%,62%);padding:0 .3em}
.shrank{background:hsl(220,80%,62%);padding:0 .3em}
table{border-collapse:collapse;font-size:.9em;margin:.4em 0}
td,th{padding:.1em .7em;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:bold;padding:.2em 0}
</style></head><body>
<h1>Where the time goes</h1>
<p><a href="/">ebpf-metricsd</a> &middot; each bar is a function (one inlined into another is
a bar of its own, where the program's debug info is on the host), as wide as the time in it and
in what it called: <span id="legend"><span class="on">on-CPU</span><span class="off">off-CPU
(blocked)</span></span>, in proportion in the wall-clock view. Click a bar (or Enter on it) to
zoom, Escape or the browser's Back to return; <kbd>/</kbd> searches, the arrow keys move from bar
to bar. The same data as pprof:
<a id="pprof" href="/debug/pprof/profile?seconds=30">/debug/pprof/profile?seconds=30</a>.
<span id="scope"></span></p>
<form id="controls" onsubmit="return false">
<label id="last">last <select id="seconds"><option>10</option><option>30</option><option selected>60</option>
<option>300</option><option>600</option><option>1800</option><option>3600</option></select> seconds</label><span id="range" hidden></span>
<label>show <select id="show"><option value="on">on-CPU time</option>
<option value="off">off-CPU time</option><option value="wall">wall-clock time</option>
<option value="slow">slow events</option></select></label>
<label id="idle-choice"><input type="checkbox" id="idle"> idle waits</label>
<label>by <select id="group"><option value="process">process</option>
<option value="workload">workload</option><option value="thread">thread</option>
<option value="none">nothing</option></select></label>
<label>compare with <select id="compare"><option value="">nothing</option>
<option value="before">the window before</option></select></label>
<label>name <select id="lines"><option value="0">function</option>
<option value="1">function:line</option></select></label>
<input id="search" size="28" placeholder="search (regular expression)">
<button type="button" id="reset">reset zoom</button>
<button type="button" id="reload">reload</button>
<span id="status"></span>
</form>
<p id="kept"></p>
<p id="diff-legend" hidden>Compared with the window of the same length just before: each bar is as
wide as this window's time, <span class="grew">red</span> where its share of this window's total is
larger than its share of the window before's, <span class="shrank">blue</span> where it is smaller
(the deeper the colour, the larger the change); both windows are normalized to their own totals.
<span id="diff-totals"></span></p>
<p id="idle-rule"></p>
<table id="processes" hidden></table>
<table id="threads" hidden></table>
<div id="graph"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let data = null, zoom = null, maxChange = 0;
// Each node's parent (the root's is null), and the bar drawn for each node.
let parents = new Map(), bars = new Map();
// Which data a history entry's zoom is of: this page's load and its count of loads.
const page = Math.random().toString(36).slice(2);
let loads = 0;

function ms(ns) { return (ns / 1e6).toFixed(1) + " ms"; }
function hash(s) { let h = 7; for (const c of s) h = (h * 31 + c.charCodeAt(0)) | 0; return Math.abs(h); }
// A node's share of its window's total, and of the base window's (a differential view).
function shares(n) {
  const t = data.root.on + data.root.off, b = data.root.b;
  return [t ? (n.on + n.off) / t : 0, b ? n.b / b : 0];
}
// Warm for on-CPU, blue for off-CPU, in between for a mix; compared with a window before,
// red for a larger share, blue for a smaller one.
function colour(n) {
  if (data.base) {
    const [now, before] = shares(n), d = now - before, i = maxChange ? Math.min(1, Math.abs(d) / maxChange) : 0;
    return "hsl(" + (d >= 0 ? 0 : 220) + ",80%," + (96 - 34 * i).toFixed(0) + "%)";
  }
  const t = n.on + n.off, off = t ? n.off / t : 0, j = hash(n.n) % 20;
  const hue = (1 - off) * (15 + j) + off * (200 + j);
  return "hsl(" + hue.toFixed(0) + "," + (80 - 15 * off).toFixed(0) + "%," + (60 + 6 * off).toFixed(0) + "%)";
}
function pattern() {
  const q = $("search").value;
  if (!q) return null;
  try { return new RegExp(q); } catch (e) { return null; }
}
function draw() {
  const graph = $("graph");
  graph.textContent = "";
  if (!data) return;
  const base = zoom || data.root, total = base.on + base.off, re = pattern();
  let depthMax = 0, matched = 0;
  bars = new Map();
  const frag = document.createDocumentFragment();
  function place(n, depth, left, inMatch) {
    const w = total ? (n.on + n.off) / total : 0;
    if (w < 0.0005) return;
    const hit = re !== null && re.test(n.n);
    if (hit && !inMatch) matched += n.on + n.off;
    const d = document.createElement("div");
    d.className = "f" + (hit ? " match" : "");
    d.style.cssText = "left:" + (left * 100).toFixed(4) + "%;width:" + (w * 100).toFixed(4) +
      "%;top:" + (depth * 18) + "px;background:" + colour(n);
    d.dataset.name = n.n;
    d.dataset.on = n.on;
    d.dataset.off = n.off;
    if (data.base) {
      const [now, before] = shares(n);
      d.dataset.change = (now - before).toFixed(6);
    }
    d.textContent = n.n;
    d.tabIndex = 0;
    d.setAttribute("role", "button");
    d.node = n;
    bars.set(n, d);
    frag.appendChild(d);
    depthMax = Math.max(depthMax, depth);
    let x = left;
    for (const c of n.c || []) { place(c, depth + 1, x, inMatch || hit); x += total ? (c.on + c.off) / total : 0; }
  }
  place(base, 0, 0, false);
  graph.style.height = ((depthMax + 1) * 18) + "px";
  graph.appendChild(frag);
  tables();
  said();
  let text = (data.slow !== undefined
      ? data.slow + " slow events (" + narrow.join(", ") + "): " + ms(data.root.off) + " of latency"
      : data.seconds.toFixed(0) + " s: on-CPU " + ms(data.root.on) + ", off-CPU " + ms(data.root.off)) +
    (data.pruned ? " (" + data.pruned + " small frames folded into their callers)" : "");
  if (re) text += "; matched: " + (total ? (100 * matched / total).toFixed(1) : "0") + "% of this view";
  $("status").textContent = text;
}
// Zooms to node n (null: the whole view), as a step the browser's Back undoes.
function zoomTo(n) {
  const to = n === data.root ? null : n;
  if (to !== zoom) {
    zoom = to;
    const path = [];
    for (let m = zoom; m && parents.get(m); m = parents.get(m)) path.unshift(parents.get(m).c.indexOf(m));
    history.pushState({ page, load: loads, zoom: path }, "");
    draw();
  }
  focusZoom();
}
function focusZoom() {
  const bar = bars.get(zoom || data.root);
  if (bar) bar.focus({ preventScroll: true });
}
// Back and Forward: a zoom of the data shown is drawn again; an entry of other data (an
// earlier window or view) is loaded as its address says.
window.addEventListener("popstate", (e) => {
  const s = e.state;
  if (!data || !s || s.page !== page || s.load !== loads) { location.reload(); return; }
  let n = data.root;
  for (const i of s.zoom) n = (n && n.c && n.c[i]) || null;
  zoom = n === data.root || n === null ? null : n;
  draw();
  focusZoom();
});
$("graph").addEventListener("click", (e) => { if (e.target.node) zoomTo(e.target.node); });
// A bar's details, made when the pointer or the focus first reaches it.
function describe(e) {
  const d = e.target, n = d.node;
  if (!n || d.title) return;
  const total = (zoom || data.root).on + (zoom || data.root).off, w = total ? (n.on + n.off) / total : 0;
  d.title = n.n + (n.m ? "  (" + n.m + ")" : "") + "\non-CPU " + ms(n.on) + ", off-CPU " +
    ms(n.off) + ", " + (w * 100).toFixed(2) + "% of this view";
  if (data.base) {
    const [now, before] = shares(n);
    d.title += "\n" + (100 * now).toFixed(2) + "% of this window, " + (100 * before).toFixed(2) +
      "% of the window before (" + ms(n.b) + ")";
  }
}
$("graph").addEventListener("mouseover", describe);
$("graph").addEventListener("focusin", describe);
// On a bar: Enter or space zooms; the arrows go to its caller, its widest callee drawn, and
// the bars beside it.
$("graph").addEventListener("keydown", (e) => {
  const n = e.target.node;
  if (!n || e.altKey || e.ctrlKey || e.metaKey) return;  // the browser's own keys
  const parent = parents.get(n), siblings = parent ? parent.c : [n];
  const drawn = (list) => list.filter((m) => bars.has(m));
  let next = null;
  if (e.key === "Enter" || e.key === " ") { zoomTo(n); e.preventDefault(); return; }
  if (e.key === "ArrowUp") next = parent;
  else if (e.key === "ArrowDown") {
    for (const c of drawn(n.c || [])) if (!next || c.on + c.off > next.on + next.off) next = c;
  }
  else if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
    const row = drawn(siblings), i = row.indexOf(n) + (e.key === "ArrowLeft" ? -1 : 1);
    next = row[i];
  } else return;
  e.preventDefault();
  if (next && bars.has(next)) bars.get(next).focus();
});
// Anywhere: / to search; Escape clears the search from its box, else zooms back out.
document.addEventListener("keydown", (e) => {
  const typing = ["INPUT", "SELECT"].includes(e.target.tagName);
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  if (e.key === "/" && !typing) { $("search").focus(); e.preventDefault(); }
  else if (e.key === "Escape" && e.target === $("search")) { $("search").value = ""; draw(); }
  else if (e.key === "Escape" && !typing && zoom) history.back();
});
// The page's own link with parameters `change` ({name: value}, null removes one).
function link(change) {
  const p = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(change)) { if (v === null) p.delete(k); else p.set(k, v); }
  return "?" + p.toString();
}
function s(ns) { return (ns / 1e9).toFixed(2) + " s"; }
// A table from rows of cells ([text, href?, numeric?]), with a caption.
function table(el, caption, head, rows) {
  el.textContent = "";
  el.hidden = rows.length === 0;
  if (!rows.length) return;
  el.createCaption().textContent = caption;
  const h = el.createTHead().insertRow();
  for (const t of head) { const th = document.createElement("th"); th.textContent = t; h.appendChild(th); }
  const body = el.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [text, href, numeric] of row) {
      const td = tr.insertCell();
      if (numeric) td.className = "n";
      if (href) { const a = document.createElement("a"); a.href = href; a.textContent = text; td.appendChild(a); }
      else td.textContent = text;
    }
  }
}
// The processes with the most time in the view (one to pick: its threads), the threads of
// the window with their time and coverage, and the idle waits set apart, by which rule.
function tables() {
  const profile = data && data.view !== undefined;
  const view = { on: "on-CPU", off: "off-CPU", wall: "wall-clock" }[profile ? data.view : "on"];
  table($("processes"), "Processes with the most " + view + " time in the window (pick one for its threads)",
    ["pid", "command", "workload", "on-CPU", "off-CPU"],
    profile && !scope.some(([k]) => k === "pid" || k === "tid") ? data.processes.slice(0, 10).map((p) => [[String(p.pid), link({ pid: p.pid, tid: null, group: "thread", idle: null })],
      [p.comm], [p.workload || ""], [s(p.on), null, true], [s(p.off), null, true]]) : []);
  table($("threads"), "Threads: time in the window (" + data.seconds.toFixed(0) +
    " s) on the CPU (" + (data.threads_exact ? "the scheduler's accounting" : "from samples") +
    "), runnable waiting for a CPU, off the CPU (waits of at least offcpu_min), and coverage ((on + off) / the window)",
    ["tid", "command", "on-CPU", "runnable", "off-CPU", "coverage"],
    profile && data.threads ? data.threads.map((t) => [[String(t.tid), link({ tid: t.tid })], [t.comm],
      [s(t.on), null, true], [t.runq === undefined ? "" : s(t.runq), null, true], [s(t.off), null, true],
      [(100 * (t.on + t.off) / 1e9 / data.seconds).toFixed(1) + "%", null, true]]) : []);
  const rule = $("idle-rule");
  rule.textContent = "";
  if (!profile || data.view === "on") return;
  const idle = data.idle;
  rule.append((idle.shown ? "Idle waits, shown: " : "Idle waits, set apart: ") + idle.waits +
    " waits, " + s(idle.ns) + ". A wait is idle when it is in " + idle.syscalls.join(", ") +
    ", or a kernel thread's (in no system call, no user frame): a thread waiting there waits " +
    "for work. ");
  const a = document.createElement("a");
  a.id = "idle-toggle";
  a.href = link({ idle: idle.shown ? "0" : "1" });
  a.textContent = idle.shown ? "Set them apart" : "Show them";
  rule.append(a, ".");
}
// What the page must say of the window: less kept than asked for, and the comparison.
function said() {
  const time = (ms) => new Date(ms).toLocaleTimeString();
  const asked = range ? Number(range[0][1]) : data.to_ms - 1000 * Number($("seconds").value);
  const base = data.base ? data.base.from_ms : null;
  $("kept").textContent = asked < data.kept_from_ms || (base !== null && base < data.kept_from_ms)
    ? "The daemon keeps profiles from " + time(data.kept_from_ms) + " on: the range asked for " +
      (data.base && asked >= data.kept_from_ms ? "and the window before it begin" : "begins") +
      " earlier, and hold" + (data.base ? "" : "s") + " only what is kept."
    : "";
  $("diff-legend").hidden = !data.base;
  if (data.base) {
    $("diff-totals").textContent = "This window: " + ms(data.root.on + data.root.off) + " in " +
      data.seconds.toFixed(0) + " s; the window before: " + ms(data.root.b) + " in " +
      data.base.seconds.toFixed(0) + " s.";
  }
}
// The largest change of share of any node (the deepest colour).
function largestChange(n) {
  const [now, before] = shares(n);
  let m = Math.abs(now - before);
  for (const c of n.c || []) m = Math.max(m, largestChange(c));
  return m;
}
async function load() {
  const show = $("show").value;
  let q = (range ? query(range).slice(1) : "seconds=" + $("seconds").value) +
    "&group=" + $("group").value;
  // Slow events are not compared.
  if ($("compare").value && show !== "slow") q += "&compare=" + $("compare").value;
  if ($("lines").value === "1") q += "&lines=1";
  q += query(scope);
  $("idle-choice").hidden = show === "on" || show === "slow";
  if (show === "slow") q += "&slow=1" + query(narrowing);
  else q += "&view=" + show + "&idle=" + ($("idle").checked ? "1" : "0");
  loads++;
  history.replaceState({ page, load: loads, zoom: [] }, "", "?" + q);
  $("status").textContent = "loading";
  try {
    // From the origin (a page opened as https://user:password@host/ may not fetch a URL
    // with credentials in it); the browser sends the ones it has for the origin.
    const r = await fetch(location.origin + "/profile/data?" + q, { credentials: "same-origin" });
    if (!r.ok) throw new Error((await r.text()).trim());
    data = await r.json();
    maxChange = data.base ? largestChange(data.root) : 0;
    parents = new Map([[data.root, null]]);
    const index = (n) => { for (const c of n.c || []) { parents.set(c, n); index(c); } };
    index(data.root);
    // No longer windows than the daemon keeps (profiles.retention).
    for (const o of [...$("seconds").options]) if (data.kept_s && Number(o.value) > data.kept_s) o.remove();
    zoom = null;
    draw();
    document.body.dataset.loaded = "1";
  } catch (e) {
    data = null;
    draw();
    $("status").textContent = String(e.message || e);
    document.body.dataset.loaded = "error";
  }
}
const params = new URLSearchParams(location.search);
// Parameters [[name, value], ...] as they follow others in a query.
const query = (pairs) => pairs.map(([k, v]) => "&" + k + "=" + encodeURIComponent(v)).join("");
// Slow events of one metric, over a latency, or of one stack (an exemplar's stack_id).
// The parameters of `names` the page was opened with, as [[name, value], ...].
const given = (names) => names.filter((k) => params.get(k)).map((k) => [k, params.get(k)]);
const narrowing = given(["metric", "min", "stack_id"]);
const narrow = narrowing.length ? narrowing.map(([k, v]) => k + " " + v) : ["all"];
// A kept range (from= and to=, Unix milliseconds, as a dashboard's link gives it) in place of
// the last N seconds.
const range = params.get("from") && params.get("to") ? given(["from", "to"]) : null;
if (range) {
  $("last").hidden = true;
  $("range").hidden = false;
  const time = (ms) => new Date(Number(ms)).toLocaleString();
  $("range").textContent = "from " + time(range[0][1]) + " to " + time(range[1][1]) + " (";
  const last = document.createElement("a");
  last.href = "?";
  last.textContent = "the last minute";
  $("range").append(last, ")");
}
// One process, thread, command or workload: the same parameters as /debug/pprof/profile's.
const scope = given(["pid", "tid", "comm", "workload"]);
if (range) {
  // The same range as pprof (a kept one: answered at once).
  const pprof = "/debug/pprof/profile?" + query(range).slice(1) + query(scope);
  $("pprof").href = pprof;
  $("pprof").textContent = pprof;
}
if (scope.length) {
  const only = scope.map(([k, v]) => k + " " + v).join(", ");
  $("scope").textContent = "Only " + only + " (";
  const all = document.createElement("a");
  all.href = "?";
  all.textContent = "everything";
  $("scope").append(all, ").");
  if (!range) {
    const pprof = "/debug/pprof/profile?seconds=30" + query(scope);
    $("pprof").href = pprof;
    $("pprof").textContent = pprof;
  }
}
if (params.get("compare") === "before") $("compare").value = "before";
if (params.get("slow") === "1") $("show").value = "slow";
else if (["on", "off", "wall"].includes(params.get("view"))) $("show").value = params.get("view");
// Idle waits are set apart for the whole host, shown for one process or thread.
$("idle").checked = params.has("idle") ? params.get("idle") === "1"
  : scope.some(([k]) => k === "pid" || k === "tid");
for (const id of ["seconds", "group", "lines"]) {
  const v = params.get(id);
  if (v && [...$(id).options].some((o) => o.value === v)) $(id).value = v;
}
if (params.get("search")) $("search").value = params.get("search");
$("seconds").addEventListener("change", load);
$("group").addEventListener("change", load);
$("lines").addEventListener("change", load);
$("show").addEventListener("change", load);
$("idle").addEventListener("change", load);
$("compare").addEventListener("change", load);
$("reload").addEventListener("click", load);
$("reset").addEventListener("click", () => { if (data) zoomTo(data.root); });
$("search").addEventListener("input", draw);
load();
</script>
</body></html>
)PAGE";

}  // namespace

std::string_view flame_graph_page() { return kPage; }

}  // namespace ebpf_metricsd::profiling
