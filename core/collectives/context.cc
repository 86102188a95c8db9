#include "core/collectives/context.h"

#include "core/error.h"

namespace towerflow::collectives {

namespace {
thread_local CollectiveContext current;
}  // namespace

const CollectiveContext& current_context() { return current; }

std::string describe(const CollectiveContext& c) {
  std::string what;
  if (c.purpose) what = c.index >= 0 ? str(c.purpose, " ", c.index) : std::string(c.purpose);
  if (c.step <= 0) return what;
  return what.empty() ? str("step ", c.step) : str("step ", c.step, ", ", what);
}

ContextScope::ContextScope(const CollectiveContext& c) : saved_(current) {
  if (c.step > 0) current.step = c.step;
  if (c.purpose) {
    current.purpose = c.purpose;
    current.index = c.index;
  }
}

ContextScope::~ContextScope() { current = saved_; }

}  // namespace towerflow::collectives
