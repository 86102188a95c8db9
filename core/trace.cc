#include "core/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/queue_event.h"

namespace towerflow::trace {
namespace {

using Clock = std::chrono::steady_clock;

// A span's work on a device queue, timed when the trace is collected.
struct DeviceSpan {
  std::string category, name, detail;
  std::shared_ptr<const QueueEvent> begin, end;
};

struct Buffer {
  std::mutex mu;
  int id = 0;
  std::string name;
  std::vector<Event> events;
  // A thread with a device queue (set_thread_device_queue): its marks, the device's track, the
  // spans waiting to be timed, and the trace's anchor (a mark reached at a known host time).
  std::function<std::shared_ptr<const QueueEvent>()> mark;
  std::shared_ptr<Buffer> device_track;
  std::vector<DeviceSpan> pending;
  std::shared_ptr<const QueueEvent> anchor;
  double anchor_us = 0;
  std::uint64_t anchor_trace = 0;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Buffer>> buffers;  // kept after their threads end
  Clock::time_point origin = Clock::now();
};

std::atomic<bool> g_on{false};
std::atomic<std::uint64_t> g_trace{0};  // which trace (start() counts them): anchors are per trace

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may end after main
  return *r;
}

std::shared_ptr<Buffer> new_buffer(std::string name = {}) {
  auto b = std::make_shared<Buffer>();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  b->id = static_cast<int>(r.buffers.size());
  b->name = !name.empty() ? std::move(name) : b->id == 0 ? "main" : str("thread ", b->id);
  r.buffers.push_back(b);
  return b;
}

Buffer& this_thread_buffer() {
  thread_local std::shared_ptr<Buffer> buffer = new_buffer();
  return *buffer;
}

bool device_timed(const char* category) {
  return std::strcmp(category, "op") == 0 || std::strcmp(category, "grad") == 0;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now() - registry().origin).count();
}

}  // namespace

bool enabled() { return g_on.load(std::memory_order_relaxed); }

void start() {
  Registry& r = registry();
  {
    std::lock_guard lock(r.mu);
    for (auto& b : r.buffers) {
      std::lock_guard bl(b->mu);
      b->events.clear();
      b->pending.clear();
    }
    r.origin = Clock::now();
  }
  g_trace.fetch_add(1, std::memory_order_relaxed);
  g_on.store(true, std::memory_order_release);
}

void stop() { g_on.store(false, std::memory_order_release); }

void set_thread_name(std::string name) {
  Buffer& b = this_thread_buffer();
  std::lock_guard lock(b.mu);
  b.name = std::move(name);
}

void time_device_spans(Buffer& b);

void set_thread_device_queue(std::string track, std::function<std::shared_ptr<const QueueEvent>()> mark) {
  Buffer& b = this_thread_buffer();
  time_device_spans(b);  // what the queue being replaced has timed stays on its track
  std::shared_ptr<Buffer> device = mark ? new_buffer(std::move(track)) : nullptr;
  std::lock_guard lock(b.mu);
  b.mark = std::move(mark);
  b.device_track = std::move(device);
  b.anchor.reset();
}

Span::Span(const char* category, std::string_view name, std::string_view detail, std::int64_t bytes) {
  if (!enabled()) return;
  on_ = true;
  category_ = category;
  name_ = name;
  detail_ = detail;
  bytes_ = bytes;
  Buffer& b = this_thread_buffer();
  if (b.mark && device_timed(category)) {
    const std::uint64_t trace = g_trace.load(std::memory_order_relaxed);
    if (b.anchor_trace != trace || !b.anchor) {  // the first device span of this trace
      auto anchor = b.mark();
      if (anchor) {
        anchor->synchronize();
        std::lock_guard lock(b.mu);
        b.anchor = std::move(anchor);
        b.anchor_us = now_us();
        b.anchor_trace = trace;
      }
    }
    if (b.anchor) device_begin_ = b.mark();
  }
  begin_us_ = now_us();
}

Span::~Span() {
  if (!on_) return;
  const double end = now_us();
  Buffer& b = this_thread_buffer();
  std::shared_ptr<const QueueEvent> device_end = device_begin_ ? b.mark() : nullptr;
  std::lock_guard lock(b.mu);
  if (device_end)
    b.pending.push_back({category_, name_, detail_, std::move(device_begin_), std::move(device_end)});
  b.events.push_back({category_, std::move(name_), std::move(detail_), begin_us_, end - begin_us_, b.id, bytes_});
}

// The device spans of a thread, timed on the device's clock and placed on the host timeline from
// the trace's anchor, as events of the device's track. Waits for the device to reach them.
void time_device_spans(Buffer& b) {
  std::vector<DeviceSpan> pending;
  std::shared_ptr<const QueueEvent> anchor;
  std::shared_ptr<Buffer> track;
  double anchor_us = 0;
  {
    std::lock_guard lock(b.mu);
    pending.swap(b.pending);
    anchor = b.anchor;
    anchor_us = b.anchor_us;
    track = b.device_track;
  }
  if (pending.empty() || !anchor || !track) return;
  std::vector<Event> timed;
  for (const DeviceSpan& d : pending) {
    const double to_begin = d.begin->milliseconds_since(*anchor), length = d.end->milliseconds_since(*d.begin);
    if (to_begin < 0 || length < 0) continue;  // a queue that cannot time
    timed.push_back({"device " + d.category, d.name, d.detail, anchor_us + 1000 * to_begin, 1000 * length, track->id});
  }
  std::lock_guard lock(track->mu);
  track->events.insert(track->events.end(), timed.begin(), timed.end());
}

std::vector<Event> collect() {
  Registry& r = registry();
  std::vector<std::shared_ptr<Buffer>> buffers;
  {
    std::lock_guard lock(r.mu);
    buffers = r.buffers;
  }
  for (auto& b : buffers) time_device_spans(*b);
  std::vector<Event> out;
  for (auto& b : buffers) {
    std::lock_guard bl(b->mu);
    out.insert(out.end(), b->events.begin(), b->events.end());
  }
  return out;
}

std::vector<Thread> threads() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<Thread> out;
  for (auto& b : r.buffers) {
    std::lock_guard bl(b->mu);
    out.push_back({b->id, b->name});
  }
  return out;
}

std::string chrome_trace_json(const std::vector<Event>& events, const std::vector<Thread>& threads) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : threads) {
    list.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", t.id}, {"args", {{"name", t.name}}}});
    list.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", t.id}, {"args", {{"sort_index", t.id}}}});
  }
  for (const auto& e : events) {
    nlohmann::json j{{"ph", "X"}, {"cat", e.category}, {"name", e.name}, {"pid", 0}, {"tid", e.thread},
                     {"ts", std::round(e.begin_us * 1000) / 1000}, {"dur", std::round(e.duration_us * 1000) / 1000}};
    if (!e.detail.empty()) j["args"]["detail"] = e.detail;
    if (e.bytes > 0) j["args"]["bytes"] = e.bytes;
    list.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump();
}

void write_chrome_trace(const std::filesystem::path& path) {
  const std::string json = chrome_trace_json(collect(), threads());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) raise<DataError>("cannot write the trace ", path.string(), ": ", std::strerror(errno));
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !ok) raise<DataError>("cannot write the trace ", path.string(), ": ", std::strerror(errno));
}

std::string summary_table(const std::vector<Event>& events, const std::vector<std::string>& categories) {
  std::map<std::pair<std::string, std::string>, std::pair<double, std::int64_t>> totals;
  double all = 0;
  for (const auto& e : events) {
    const bool wanted = categories.empty() ? (e.category != "layer" && e.category != "phase" && e.category != "step" &&
                                              e.category != "kernel")
                                           : std::find(categories.begin(), categories.end(), e.category) != categories.end();
    if (!wanted) continue;
    auto& t = totals[{e.category, e.name}];
    t.first += e.duration_us;
    ++t.second;
    all += e.duration_us;
  }
  std::vector<std::pair<std::pair<std::string, std::string>, std::pair<double, std::int64_t>>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out = "category     op                              calls    total ms   share\n";
  char line[160];
  for (const auto& [key, v] : rows) {
    std::snprintf(line, sizeof line, "%-12s %-30s %7lld %11.2f %6.1f%%\n", key.first.c_str(), key.second.c_str(),
                  static_cast<long long>(v.second), v.first / 1e3, all > 0 ? 100.0 * v.first / all : 0.0);
    out += line;
  }
  return out;
}

std::vector<BandwidthRow> bandwidth_rows(const std::vector<Event>& events, double bound_bytes_per_s) {
  std::map<std::string, BandwidthRow> by_name;
  for (const auto& e : events) {
    if (e.bytes <= 0) continue;
    BandwidthRow& r = by_name[e.name];
    r.name = e.name;
    ++r.calls;
    r.bytes += e.bytes;
    r.ms += e.duration_us / 1e3;
  }
  std::vector<BandwidthRow> rows;
  for (auto& [name, r] : by_name) {
    r.bound_ms = bound_bytes_per_s > 0 ? 1e3 * static_cast<double>(r.bytes) / bound_bytes_per_s : 0;
    r.gb_per_s = r.ms > 0 ? static_cast<double>(r.bytes) / (r.ms * 1e6) : 0;
    r.over_bound = r.bound_ms > 0 ? r.ms / r.bound_ms : 0;
    r.in_cache = r.bytes < kInCacheBytes * r.calls;
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.in_cache != b.in_cache ? b.in_cache : a.over_bound > b.over_bound;
  });
  return rows;
}

std::string bandwidth_table(const std::vector<BandwidthRow>& rows) {
  std::string out = "kernel                          calls    total ms       MiB    GB/s   bound ms  x bound\n";
  char line[200];
  bool cache_line_written = false;
  for (const auto& r : rows) {
    if (r.in_cache && !cache_line_written) {
      out += "in cache (under 1 MiB a call: calling them costs more than their bytes, the bound is not theirs):\n";
      cache_line_written = true;
    }
    std::snprintf(line, sizeof line, "%-30s %7lld %11.2f %9.1f %7.2f %10.2f %7.2fx\n", r.name.c_str(),
                  static_cast<long long>(r.calls), r.ms, static_cast<double>(r.bytes) / (1 << 20), r.gb_per_s,
                  r.bound_ms, r.over_bound);
    out += line;
  }
  return out;
}

}  // namespace towerflow::trace
