#include "ebpf_metricsd/profile/profile_routes.h"

#include <cctype>
#include <charconv>
#include <stdexcept>

#include "ebpf_metricsd/base/gzip.h"
#include "ebpf_metricsd/metrics/log2_histogram.h"
#include "ebpf_metricsd/profile/flame_graph.h"
#include "ebpf_metricsd/profile/pprof.h"

namespace ebpf_metricsd::profiling {

namespace {

HttpResponse bad_request(const std::string& why) {
  HttpResponse r;
  r.status = 400;
  r.body = "400 bad request: " + why + "\n";
  return r;
}

HttpResponse not_running() {
  HttpResponse r;
  r.status = 503;
  r.body = "503 the profile tracer is not running (enable tracers.profile in the config)\n";
  return r;
}

// `seconds` as the request gives it: one whole number from 1 to `max`; `fallback` when
// absent (0: it must be given).
std::variant<int, std::string> window_seconds(const HttpRequest& req, int max, int fallback = 0) {
  const auto values = req.params("seconds");
  if (values.empty() && fallback) return fallback;
  if (values.empty()) return "seconds is missing (e.g. ?seconds=30)";
  if (values.size() > 1) return "seconds is given more than once";
  const std::string_view v = values.front();
  if (v.empty()) return "seconds is empty";
  int n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  const bool whole = end == v.data() + v.size();
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && whole && n > max)) {
    return "seconds must be at most " + std::to_string(max);
  }
  if (ec != std::errc() || !whole) return "seconds is not a whole number of seconds";
  if (n <= 0) return "seconds must be at least 1";
  return n;
}

// A serialized pprof Profile as the file Go's endpoints serve: a gzipped protobuf message,
// whatever the transfer encoding.
HttpResponse pprof_file(const std::string& profile, const char* name) {
  auto body = gzip(profile, 6);
  if (!body) throw std::runtime_error("gzip failed");
  HttpResponse r;
  r.content_type = "application/octet-stream";
  r.body = std::move(*body);
  r.headers.emplace_back("Content-Disposition",
                         std::string("attachment; filename=\"") + name + "\"");
  return r;
}

// At most one value of parameter `name`; nullopt when absent, an error when repeated.
std::variant<std::optional<std::string>, std::string> single(const HttpRequest& req,
                                                             const char* name) {
  const auto values = req.params(name);
  if (values.size() > 1) return std::string(name) + " is given more than once";
  if (values.empty()) return std::optional<std::string>();
  return std::optional<std::string>(std::string(values.front()));
}

// Parameter `name` as 0 or 1, at most once; nullopt when absent.
std::variant<std::optional<bool>, std::string> flag(const HttpRequest& req, const char* name) {
  const auto value = single(req, name);
  if (const auto* why = std::get_if<std::string>(&value)) return *why;
  const auto& given = std::get<std::optional<std::string>>(value);
  if (!given) return std::optional<bool>{};
  if (*given != "0" && *given != "1") return std::string(name) + " must be 0 or 1";
  return std::optional<bool>{*given == "1"};
}

// How long the store keeps profiles, in seconds: the longest window a reader can ask for.
int kept_seconds(Profiles& profiles) {
  return static_cast<int>(profiles.store().limits().retention.count());
}

// A range as a request gives it: from= and to=, Unix times in milliseconds (as Grafana's
// ${__from} and ${__to}), both or neither, at most a year apart, in place of seconds=. What
// the store keeps of it answers (a dashboard's range is often longer than that).
struct Range {
  Clock::time_point from, to;
  std::chrono::system_clock::time_point wall_from, wall_to;
};
std::variant<std::optional<Range>, std::string> kept_range(const HttpRequest& req) {
  std::uint64_t ms[2] = {};
  bool given[2] = {};
  const char* names[2] = {"from", "to"};
  for (int i = 0; i < 2; ++i) {
    const auto value = single(req, names[i]);
    if (const auto* why = std::get_if<std::string>(&value)) return *why;
    const auto& v = std::get<std::optional<std::string>>(value);
    if (!v) continue;
    given[i] = true;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), ms[i]);
    if (v->empty() || ec != std::errc() || end != v->data() + v->size()) {
      return std::string(names[i]) + " is not a Unix time in milliseconds";
    }
  }
  if (!given[0] && !given[1]) return std::optional<Range>();
  if (!given[0] || !given[1]) return "from and to go together (Unix times in milliseconds)";
  if (!req.params("seconds").empty()) return "give seconds, or from and to";
  if (ms[1] <= ms[0]) return "to must be after from";
  constexpr std::uint64_t kYear = 366ULL * 24 * 3600 * 1000;
  if (ms[1] - ms[0] > kYear) return "from and to are at most a year apart";
  // On the monotonic clock the store keeps: now on both clocks, then the distance.
  const auto wall_now = std::chrono::system_clock::now();
  const Clock::time_point now = Clock::now();
  const auto at = [&](std::uint64_t unix_ms) {
    return now + std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(unix_ms) -
                                                             wall_now.time_since_epoch());
  };
  const auto wall = [](std::uint64_t unix_ms) {
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::milliseconds(unix_ms)));
  };
  return std::optional<Range>(Range{at(ms[0]), at(ms[1]), wall(ms[0]), wall(ms[1])});
}

// A process or thread ID as a request gives it: a whole number from 1 to 4194304
// (PID_MAX_LIMIT), or an error naming `name`.
std::variant<std::uint32_t, std::string> task_id(std::string_view v, const char* name) {
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n == 0 || n > 4194304) {
    return std::string(name) + " is not a process or thread ID (1 to 4194304)";
  }
  return n;
}

// Parameter `name` as text of 1 to `max` bytes (nullopt when absent), or why not; `too_long`
// says what a longer one is not.
std::variant<std::optional<std::string>, std::string> bounded_text(const HttpRequest& req,
                                                                   const char* name,
                                                                   std::size_t max,
                                                                   const char* too_long) {
  auto value = single(req, name);
  if (const auto& v = std::get_if<std::optional<std::string>>(&value); v && *v) {
    if ((*v)->empty()) return std::string(name) + " is empty";
    if ((*v)->size() > max) return std::string(name) + " is longer than " + too_long;
  }
  return value;
}

// The samples a profile request wants: pid=, tid=, comm=, workload= (each at most once).
std::variant<SampleFilter, std::string> sample_filter(const HttpRequest& req) {
  SampleFilter f;
  for (const char* name : {"pid", "tid"}) {
    const auto value = single(req, name);
    if (const auto* why = std::get_if<std::string>(&value)) return *why;
    if (const auto& v = std::get<std::optional<std::string>>(value)) {
      const auto id = task_id(*v, name);
      if (const auto* why = std::get_if<std::string>(&id)) return *why;
      (name[0] == 'p' ? f.pid : f.tid) = std::get<std::uint32_t>(id);
    }
  }
  auto comm = bounded_text(req, "comm", 15, "the kernel's 15 characters");
  if (const auto* why = std::get_if<std::string>(&comm)) return *why;
  f.comm = std::get<std::optional<std::string>>(std::move(comm));
  auto workload = bounded_text(req, "workload", 4096, "a cgroup path");
  if (const auto* why = std::get_if<std::string>(&workload)) return *why;
  f.workload = std::get<std::optional<std::string>>(std::move(workload));
  return f;
}

// The query of /debug/pprof/slow: metric=NAME, min=DURATION, stack_id=HEX, and seconds=N (at
// most `kept`, what the store keeps) or from= and to=.
std::variant<SlowEventStore::Query, std::string> slow_query(const HttpRequest& req, int kept) {
  SlowEventStore::Query q;
  const auto range = kept_range(req);
  if (const auto* why = std::get_if<std::string>(&range)) return *why;
  if (const auto& r = std::get<std::optional<Range>>(range)) {
    q.since = r->wall_from;
    q.until = r->wall_to;
  } else {
    const auto seconds = window_seconds(req, kept, kept);
    if (const auto* why = std::get_if<std::string>(&seconds)) return *why;
    q.since = std::chrono::system_clock::now() - std::chrono::seconds(std::get<int>(seconds));
  }
  const auto metric = single(req, "metric");
  if (const auto* why = std::get_if<std::string>(&metric)) return *why;
  if (const auto& m = std::get<std::optional<std::string>>(metric)) {
    for (const char c : *m) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') {
        return "metric is not a metric name";
      }
    }
    if (m->empty()) return "metric is empty";
    q.metric = *m;
  }
  const auto min = single(req, "min");
  if (const auto* why = std::get_if<std::string>(&min)) return *why;
  if (const auto& m = std::get<std::optional<std::string>>(min)) {
    try {
      q.min_ns = parse_nanoseconds(*m);
    } catch (const std::exception& e) {
      return std::string("min: ") + e.what();
    }
    if (q.min_ns > 3600ULL * 1000000000ULL) return "min must be at most 1h";
  }
  const auto id = single(req, "stack_id");
  if (const auto* why = std::get_if<std::string>(&id)) return *why;
  if (const auto& text = std::get<std::optional<std::string>>(id)) {
    q.stack_id = parse_stack_id(*text);
    if (!q.stack_id) return "stack_id is not up to 16 hex digits";
  }
  return q;
}

// The slow events of query q that filter f keeps.
SlowWindow slow_events(Profiles& profiles, const SlowEventStore::Query& q, const SampleFilter& f) {
  SlowWindow w = profiles.slow_events().query(q);
  std::erase_if(w.events, [&](const SlowEvent& e) { return !f.matches(e); });
  return w;
}

// What a request for slow events asks: which events (metric=, min=, stack_id=, seconds=)
// and whose (the sample filter). Both /debug/pprof/slow and the page's slow=1 read it.
struct SlowRequest {
  SlowEventStore::Query query;
  SampleFilter filter;
};
std::variant<SlowRequest, std::string> slow_request(const HttpRequest& req, int kept) {
  auto query = slow_query(req, kept);
  if (auto* why = std::get_if<std::string>(&query)) return std::move(*why);
  auto filter = sample_filter(req);
  if (auto* why = std::get_if<std::string>(&filter)) return std::move(*why);
  return SlowRequest{std::get<SlowEventStore::Query>(query), std::get<SampleFilter>(filter)};
}

// A route of what the store keeps: answered at once, on a worker, at most
// kMaxFlameGraphRequests at a time.
Route kept_route(
    std::string path,
    std::function<std::variant<HttpResponse, DeferredResponse>(const HttpRequest&)> handler) {
  Route r;
  r.path = std::move(path);
  r.max_deferred = kMaxFlameGraphRequests;
  r.deferred = std::move(handler);
  return r;
}

// Answered on a worker, without waiting.
DeferredResponse at_once(std::function<HttpResponse()> answer) {
  return DeferredResponse{{}, std::chrono::milliseconds(0), std::move(answer)};
}

}  // namespace

std::vector<Route> profile_routes(const std::shared_ptr<Profiles>& profiles) {
  Route profile;
  profile.path = "/debug/pprof/profile";
  profile.max_deferred = kMaxProfileRequests;
  profile.deferred =
      [profiles](const HttpRequest& req) -> std::variant<HttpResponse, DeferredResponse> {
    auto filter = sample_filter(req);
    if (const auto* why = std::get_if<std::string>(&filter)) return bad_request(*why);
    // A range the store keeps: answered at once.
    const auto range = kept_range(req);
    if (const auto* why = std::get_if<std::string>(&range)) return bad_request(*why);
    if (const auto& r = std::get<std::optional<Range>>(range)) {
      return at_once([profiles, r = *r, f = std::get<SampleFilter>(filter)] {
        profiles->cut();
        return pprof_file(pprof_profile(profiles->store().window(r.from, r.to, f)), "profile");
      });
    }
    const auto seconds = window_seconds(req, kMaxProfileSeconds);
    if (const auto* why = std::get_if<std::string>(&seconds)) return bad_request(*why);
    if (!profiles->running()) return not_running();
    auto from = std::make_shared<Clock::time_point>();
    return DeferredResponse{
        // The window starts once what the kernel side holds now has been read, so that it
        // holds only what happens from then on. Made on a worker: a read may wait for one
        // in progress.
        [profiles, from] {
          profiles->cut();
          *from = Clock::now();
        },
        std::chrono::seconds(std::get<int>(seconds)),
        [profiles, from, f = std::get<SampleFilter>(filter)]() {
          if (!profiles->cut()) {
            HttpResponse r;
            r.status = 503;
            r.body = "503 the profile tracer stopped during the window\n";
            return r;
          }
          return pprof_file(pprof_profile(profiles->store().window(*from, Clock::now(), f)),
                            "profile");
        }};
  };
  Route page{"/profile", [](const HttpRequest&) {
               HttpResponse r;
               r.content_type = "text/html; charset=utf-8";
               r.body = std::string(flame_graph_page());
               r.compressible = true;
               return r;
             }};
  // The last N seconds (the page's data), from what the store keeps.
  Route data = kept_route(
      "/profile/data",
      [profiles](const HttpRequest& req) -> std::variant<HttpResponse, DeferredResponse> {
        const auto seconds = window_seconds(req, kept_seconds(*profiles), 60);
        if (const auto* why = std::get_if<std::string>(&seconds)) return bad_request(*why);
        FlameGrouping grouping = FlameGrouping::Process;
        const auto group = single(req, "group");
        if (const auto* why = std::get_if<std::string>(&group)) return bad_request(*why);
        if (const auto& name = std::get<std::optional<std::string>>(group)) {
          const auto g = parse_flame_grouping(*name);
          if (!g) return bad_request("group must be process, workload, thread or none");
          grouping = *g;
        }
        // lines=1: nodes named function:line.
        const auto lines_param = flag(req, "lines");
        if (const auto* why = std::get_if<std::string>(&lines_param)) return bad_request(*why);
        const bool lines = std::get<std::optional<bool>>(lines_param).value_or(false);
        // slow=1: the stacks of the tracers' slow events (metric=, min=, stack_id= narrow them).
        const auto slow = single(req, "slow");
        if (const auto* why = std::get_if<std::string>(&slow)) return bad_request(*why);
        if (const auto& on = std::get<std::optional<std::string>>(slow)) {
          if (*on != "1") return bad_request("slow must be 1");
          auto asked = slow_request(req, kept_seconds(*profiles));
          if (const auto* why = std::get_if<std::string>(&asked)) return bad_request(*why);
          return at_once([profiles, grouping, lines, a = std::get<SlowRequest>(asked)] {
            const SlowWindow events = slow_events(*profiles, a.query, a.filter);
            HttpResponse r;
            r.content_type = "application/json";
            r.body = flame_graph_json(slow_profile_window(events), grouping, kMaxFlameGraphNodes,
                                      events.events.size(), lines);
            r.compressible = true;
            return r;
          });
        }
        for (const char* narrowing : {"metric", "min", "stack_id"}) {
          if (!req.params(narrowing).empty()) {
            return bad_request(std::string(narrowing) +
                               " narrows slow events: give slow=1 with it");
          }
        }
        auto filter = sample_filter(req);
        if (const auto* why = std::get_if<std::string>(&filter)) return bad_request(*why);
        const SampleFilter& f = std::get<SampleFilter>(filter);
        // view=on (the default), off or wall; idle=0 sets idle waits apart, idle=1 shows them
        // (the default for one process or thread, which asked about its waits).
        FlameSelection selection{FlameView::OnCpu, f.pid.has_value() || f.tid.has_value()};
        const auto view = single(req, "view");
        if (const auto* why = std::get_if<std::string>(&view)) return bad_request(*why);
        if (const auto& name = std::get<std::optional<std::string>>(view)) {
          const auto v = parse_flame_view(*name);
          if (!v) return bad_request("view must be on, off or wall");
          selection.view = *v;
        }
        const auto idle = flag(req, "idle");
        if (const auto* why = std::get_if<std::string>(&idle)) return bad_request(*why);
        selection.idle = std::get<std::optional<bool>>(idle).value_or(selection.idle);
        // from= and to= (a kept range) in place of the last `seconds`; compare=before: against
        // the range of the same length just before (a differential flame graph).
        const auto range = kept_range(req);
        if (const auto* why = std::get_if<std::string>(&range)) return bad_request(*why);
        const std::optional<Range> kept = std::get<std::optional<Range>>(range);
        const auto compare = single(req, "compare");
        if (const auto* why = std::get_if<std::string>(&compare)) return bad_request(*why);
        const auto& against = std::get<std::optional<std::string>>(compare);
        if (against && *against != "before") return bad_request("compare must be before");
        if (!kept && !profiles->running()) return not_running();
        return at_once(
            [profiles, seconds, grouping, lines, f, selection, kept, before = against.has_value()] {
              profiles->cut();
              Range r;
              if (kept) {
                r = *kept;
              } else {
                r.to = Clock::now();
                r.from = r.to - std::chrono::seconds(std::get<int>(seconds));
              }
              const ProfileWindow w = profiles->store().window(r.from, r.to, f);
              std::optional<ProfileWindow> base;
              FlameSelection select = selection;
              if (before) {
                base = profiles->store().window(r.from - (r.to - r.from), r.from, f);
                select.base = &*base;
              }
              HttpResponse response;
              response.content_type = "application/json";
              response.body = flame_graph_json(w, grouping, kMaxFlameGraphNodes, {}, lines, select);
              response.compressible = true;
              return response;
            });
      });
  // The stacks of the tracers' slow events (a metric's, those over a latency, one
  // stack_id's) in the last N seconds, from what the store keeps.
  Route slow = kept_route(
      "/debug/pprof/slow",
      [profiles](const HttpRequest& req) -> std::variant<HttpResponse, DeferredResponse> {
        auto asked = slow_request(req, kept_seconds(*profiles));
        if (const auto* why = std::get_if<std::string>(&asked)) return bad_request(*why);
        return at_once([profiles, a = std::get<SlowRequest>(asked)] {
          return pprof_file(pprof_slow(slow_events(*profiles, a.query, a.filter)), "slow");
        });
      });
  return {std::move(profile), std::move(page), std::move(data), std::move(slow)};
}

}  // namespace ebpf_metricsd::profiling
