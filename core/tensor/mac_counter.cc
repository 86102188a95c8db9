#include "core/tensor/mac_counter.h"

#include "core/tensor/ops.h"

namespace towerflow {
namespace {
thread_local MacCounter* t_current = nullptr;
}  // namespace

MacCounter::MacCounter() : outer_(t_current) { t_current = this; }

MacCounter::~MacCounter() { t_current = outer_; }

std::int64_t MacCounter::total() const {
  std::int64_t t = 0;
  for (const Row& r : rows_) t += r.macs;
  return t;
}

std::int64_t MacCounter::total(const std::string& prefix) const {
  std::int64_t t = 0;
  for (const Row& r : rows_)
    if (r.op.starts_with(prefix)) t += r.macs;
  return t;
}

bool MacCounter::active() { return t_current != nullptr; }

void MacCounter::count(const char* op, const std::string& shape, std::int64_t macs) {
  if (t_current) t_current->rows_.push_back({OpScope::current(), op, shape, macs});
}

}  // namespace towerflow
