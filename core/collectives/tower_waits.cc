#include "core/collectives/tower_waits.h"

#include <cmath>

#include "core/collectives/process_group.h"
#include "core/error.h"

namespace towerflow::collectives {

// Note [Stall reports among towers]: the towers of one process wait for each other in the local
// communicator's barrier and in synchronised batch norm's exchange. Each waiter marks its arrival;
// the first to arrive at a wait (it waits longest) sleeps with a deadline and, after
// stall_warning, logs which towers are waiting and which have not arrived, with the collective and
// the step and bucket its thread is in (CollectiveContext), and again after twice as long each
// time. At the timeout it aborts the wait with a reason naming the absent towers: every waiter
// raises CollectiveAborted, the trainer's step fails with that reason once the late tower arrives
// (a thread cannot be stopped from outside), and the error is logged at once so that a tower
// that never arrives is still named. The others sleep without a deadline, so n towers cost one
// timer, and a stall is said once rather than n - 1 times. Collectives across processes report
// through their process group (Note [Stall reports] in mpi_process_group.cc).

WaitLimits WaitLimits::from_environment() {
  const WaitLimits defaults;
  return {.stall_warning = collectives::stall_warning(defaults.stall_warning),
          .timeout = collective_timeout(defaults.timeout)};
}

namespace {
std::string towers(const TowerWait& w, bool arrived) {
  std::string s;
  int count = 0;
  for (std::size_t i = 0; i < w.devices.size(); ++i) {
    if (w.arrived[i] != arrived) continue;
    s += str(s.empty() ? "" : ", ", i, " (", w.devices[i], ")");
    ++count;
  }
  if (count == 0) return "none";
  return str(count == 1 ? "tower " : "towers ", s);
}

std::string where(const TowerWait& w) {
  const std::string context = describe(w.context);
  return context.empty() ? std::string(w.what) : str(w.what, " at ", context);
}

double tenths(double s) { return std::round(s * 10) / 10; }
}  // namespace

std::string stall_report(const TowerWait& w, double waited_s, const WaitLimits& limits) {
  return str("stall: ", towers(w, true), " waited ", tenths(waited_s), " s in ", where(w),
             "; not arrived: ", towers(w, false), ". The waiters give up ",
             limits.timeout.count() / 1000.0, " s after the first arrived (TOWERFLOW_COLLECTIVE_TIMEOUT); "
             "TOWERFLOW_STALL_WARNING sets when this is said");
}

std::string timeout_reason(const TowerWait& w, double waited_s) {
  return str(towers(w, false), " did not arrive at ", where(w), " within ", tenths(waited_s), " s; ",
             towers(w, true), " waited. A tower that late hangs or is far behind; raise "
             "TOWERFLOW_COLLECTIVE_TIMEOUT, in seconds, if one is legitimately that slow");
}

}  // namespace towerflow::collectives
