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
// - Device time: a thread that drives a device with a queue of its own (a GPU's stream) installs
//   the device's timing marks (set_thread_device_queue; tower::DeviceWorkers does for GPU towers).
//   Then each "op" and "grad" span of that thread also records a timing mark on the device queue
//   where it begins and where it ends, and collect() turns each pair into an event on the
//   device's own track ("/gpu:0 stream"): when the device ran that work and for how long, placed
//   on the host timeline through an anchor mark the first such span of a trace waits for. These
//   cost two marks per span (CUDA event records) while tracing, nothing otherwise.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace towerflow {
class QueueEvent;
}

namespace towerflow::trace {

bool enabled();
void start();
void stop();

// Names the calling thread's track ("tower 0 (/cpu:0)", "loader 1", "main").
void set_thread_name(std::string name);

// Installs the calling thread's device queue (see the contract): `mark` records a timing mark
// after the work queued so far (Backend::record_timing_event), `track` names the device's track.
// An empty `mark` removes it.
void set_thread_device_queue(std::string track, std::function<std::shared_ptr<const QueueEvent>()> mark);

// A complete event ("ph": "X") on the calling thread: category (forward, backward, reduction,
// optimizer, data, copy, step, layer, kernel, ...), name, and an optional detail shown as
// args.detail. `bytes`, where given, is the memory traffic the work cannot do without (each
// operand read or written once; args.bytes): bandwidth_rows() sets it against a bandwidth bound.
class Span {
 public:
  Span(const char* category, std::string_view name, std::string_view detail = {},
       std::int64_t bytes = 0);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_ = false;
  const char* category_ = nullptr;
  std::string name_, detail_;
  std::int64_t bytes_ = 0;
  double begin_us_ = 0;
  std::shared_ptr<const QueueEvent> device_begin_;  // on a thread with a device queue
};

struct Event {
  std::string category, name, detail;
  double begin_us = 0, duration_us = 0;
  int thread = 0;
  std::int64_t bytes = 0;  // 0: not counted
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
// but "layer", "phase", "step" and "kernel", which contain others or sit inside others), largest
// first, as a fixed-width table. Shares are of the time summed over every thread.
std::string summary_table(const std::vector<Event>& events, const std::vector<std::string>& categories = {});

// The memory-bound work of a trace against a bandwidth bound: per name, over the events that
// count their bytes, the time taken and the time the bytes need at `bound_bytes_per_s`, the
// bandwidth one such event can have (a STREAM figure; where several towers run the same work at
// once, the machine's figure divided among them). `over_bound` is their ratio (1: at the bound).
// Rows of kernels that move under kInCacheBytes a call on average are `in_cache`: their operands
// fit in the caches, where calling the kernel costs more than its bytes, and the bound is not
// theirs; they are listed after the others.
constexpr std::int64_t kInCacheBytes = std::int64_t{1} << 20;
struct BandwidthRow {
  std::string name;
  std::int64_t calls = 0, bytes = 0;
  double ms = 0, bound_ms = 0, gb_per_s = 0, over_bound = 0;
  bool in_cache = false;
};
std::vector<BandwidthRow> bandwidth_rows(const std::vector<Event>& events, double bound_bytes_per_s);
// The rows as a fixed-width table, the furthest from the bound first, the in_cache rows after a
// line that says what they are.
std::string bandwidth_table(const std::vector<BandwidthRow>& rows);

}  // namespace towerflow::trace
