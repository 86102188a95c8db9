#pragma once
// Stall reports and the deadline of a wait among the towers of one process: the local
// communicator's barrier and synchronised batch norm's exchange (Note [Stall reports among
// towers] in tower_waits.cc).

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "core/collectives/context.h"
#include "core/device.h"

namespace towerflow::collectives {

struct WaitLimits {
  std::chrono::milliseconds stall_warning{5'000};  // the first report
  std::chrono::milliseconds timeout{300'000};      // the waiters give up
  // TOWERFLOW_STALL_WARNING and TOWERFLOW_COLLECTIVE_TIMEOUT where set, else the defaults above
  // (InvalidArgument naming a bad value).
  static WaitLimits from_environment();
};

// When the first participant to arrive reports next: after the warning, then after twice as long
// each time, until the timeout.
class StallSchedule {
 public:
  using Clock = std::chrono::steady_clock;
  StallSchedule(const WaitLimits& limits, Clock::time_point start)
      : start_(start), report_(start + limits.stall_warning), deadline_(start + limits.timeout) {}
  Clock::time_point next() const { return std::min(report_, deadline_); }
  bool timed_out(Clock::time_point now) const { return now >= deadline_; }
  double waited_s(Clock::time_point now) const { return std::chrono::duration<double>(now - start_).count(); }
  void reported() { report_ += report_ - start_; }

 private:
  Clock::time_point start_, report_, deadline_;
};

// What the towers of one wait are doing: `what` is the collective ("all-reduce #37 of the local
// communicator (4096 bytes)"), `arrived[i]` whether tower i (on devices[i]) is waiting in it.
struct TowerWait {
  std::string_view what;
  const CollectiveContext& context;
  const std::vector<Device>& devices;
  const std::vector<bool>& arrived;
};

// "stall: towers 0 (cpu:0), 2 (cpu:2) have waited 5.0 s in ... (step 12, gradient bucket 3);
//  not arrived: tower 1 (cpu:1). ..."
std::string stall_report(const TowerWait& wait, double waited_s, const WaitLimits& limits);
// The abort reason at the deadline: names the towers that have not arrived.
std::string timeout_reason(const TowerWait& wait, double waited_s);

}  // namespace towerflow::collectives
