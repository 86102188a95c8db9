#include "train/trace.h"

#include <charconv>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"

namespace towerflow::train {

void parse_trace_steps(std::string_view spec, TraceOptions& o) {
  auto number = [&](std::string_view s, std::int64_t& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size() && out >= 1;
  };
  const auto colon = spec.find(':');
  std::int64_t a = 0, b = 0;
  const bool ok = colon == std::string_view::npos ? number(spec, a) && (b = a, true)
                                                  : number(spec.substr(0, colon), a) && number(spec.substr(colon + 1), b);
  if (!ok || b < a)
    raise<InvalidArgument>("trace steps \"", spec, "\" are not A:B with 1 <= A <= B (steps count from 1); write e.g. 101:110");
  o.first_step = a;
  o.last_step = b;
}

Trace::Trace(TraceOptions options) : options_(std::move(options)) {
  if (options_.first_step < 1 || options_.last_step < options_.first_step)
    raise<InvalidArgument>("trace steps ", options_.first_step, ":", options_.last_step,
                           " are not A:B with 1 <= A <= B");
}

Trace::~Trace() {
  if (active_) trace::stop();
}

void Trace::on_start(const StartInfo& start) {
  trace::set_thread_name("training loop");
  const std::int64_t next = start.position.step + 1;
  if (next >= options_.first_step && next <= options_.last_step) {
    trace::start();
    active_ = true;
    began_at_ = next;
  }
}

void Trace::on_step(const StepInfo& s) {
  if (!active_ && !written_ && s.step + 1 == options_.first_step) {
    trace::start();  // before the next step's wait for its batch
    active_ = true;
    began_at_ = s.step + 1;
  } else if (active_ && s.step >= options_.last_step) {
    finish(s.step);
  }
}

void Trace::on_end(const FitResult& r) {
  if (active_) finish(r.steps);
}

void Trace::finish(std::int64_t last_step) {
  trace::stop();
  active_ = false;
  trace::write_chrome_trace(options_.path);
  written_ = true;
  summary_ = trace::summary_table(trace::collect());
  log_info(str("trace of steps ", began_at_, "..", last_step, " written to ", options_.path.string(),
               " (open it in ui.perfetto.dev or chrome://tracing); time per op and kind of work, over every thread:\n",
               summary_));
}

}  // namespace towerflow::train
