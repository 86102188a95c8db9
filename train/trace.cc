#include "train/trace.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"

namespace towerflow::train {
namespace fs = std::filesystem;

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
  // A trace that cannot be written, or steps the run never makes, are said now, not after training.
  std::error_code ec;
  const fs::path folder = options_.path.has_parent_path() ? options_.path.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, ec))
    raise<DataError>("cannot write the trace ", options_.path.string(), ": its folder ", folder.string(),
                     " does not exist; create it or choose another path");
  if (::access(folder.c_str(), W_OK) != 0 || (fs::exists(options_.path, ec) && ::access(options_.path.c_str(), W_OK) != 0))
    raise<DataError>("cannot write the trace ", options_.path.string(), ": ", std::strerror(errno),
                     "; choose a path this process may write");
  if (options_.first_step > start.plan.total_steps || options_.last_step <= start.position.step)
    log_warning(str("trace steps ", options_.first_step, ":", options_.last_step, " are outside the steps this run makes (",
                    start.position.step + 1, "..", start.plan.total_steps,
                    "): nothing will be traced; choose steps in that range"));
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
