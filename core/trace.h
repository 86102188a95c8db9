#pragma once
// Trace: a timeline of what every thread does, written as Chrome Trace Event JSON (Perfetto and
// chrome://tracing open it), like TensorFlow's profiler trace or torch.profiler's export.
//
//   trace::start();                              // from now on, spans are recorded
//   { trace::Span s("step", "optimizer"); ... }  // a complete event on this thread's track
//   trace::stop();
//   trace::write_chrome_trace("trace.json");     // one track per thread, named by set_thread_name
//   std::cout << trace::summary_table(trace::collect());
//
// Contract:
// - Off (the default), a Span costs one relaxed atomic load and records nothing: nothing of the
//   trace sits in the step's hot path.
// - On, each thread appends to its own buffer (an uncontended lock), so threads do not serialise
//   on the trace. A span that began while tracing was on is recorded when it ends, even after
//   stop(). Spans on one thread nest properly (RAII).
// - Times are microseconds since start(), from the steady clock.
// - start() clears what an earlier trace recorded. collect() / write_chrome_trace() after stop().
// - Thread-safety: any thread may open spans; start/stop/collect from one controlling thread.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow::trace {

bool enabled();
void start();
void stop();

// Names the calling thread's track ("tower 0 (/cpu:0)", "loader 1", "main").
void set_thread_name(std::string name);

// A complete event ("ph": "X") on the calling thread: category (forward, backward, reduction,
// optimizer, data, copy, step, layer, ...), name, and an optional detail shown as args.detail.
class Span {
 public:
  Span(const char* category, std::string_view name, std::string_view detail = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_ = false;
  const char* category_ = nullptr;
  std::string name_, detail_;
  double begin_us_ = 0;
};

struct Event {
  std::string category, name, detail;
  double begin_us = 0, duration_us = 0;
  int thread = 0;
};
struct Thread {
  int id = 0;
  std::string name;
};

// Every recorded event, by thread, in the order they ended; and the threads.
std::vector<Event> collect();
std::vector<Thread> threads();

// The Chrome Trace Event JSON document: {"traceEvents": [...], "displayTimeUnit": "ms"}.
std::string chrome_trace_json(const std::vector<Event>& events, const std::vector<Thread>& threads);
// Writes collect() as JSON. DataError naming the path when it cannot.
void write_chrome_trace(const std::filesystem::path& path);

// Total time and share per (category, name) over the events of the given categories (empty: all
// but "layer", "phase" and "step", which contain others), largest first, as a fixed-width table.
// Shares are of the time summed over every thread.
std::string summary_table(const std::vector<Event>& events, const std::vector<std::string>& categories = {});

}  // namespace towerflow::trace
