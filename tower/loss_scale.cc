#include "tower/loss_scale.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace towerflow::tower {

LossScaler::LossScaler(const LossScaleOptions& o) : options_(o) {
  if (!(o.initial_scale > 0) || !std::isfinite(o.initial_scale))
    raise<InvalidArgument>("loss scale: initial_scale = ", o.initial_scale,
                           " must be a positive finite number; 65536 is the usual start");
  if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor))
    raise<InvalidArgument>("loss scale: growth_factor = ", o.growth_factor, " must be > 1; 2 is usual");
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    raise<InvalidArgument>("loss scale: backoff_factor = ", o.backoff_factor,
                           " must lie strictly between 0 and 1; 0.5 is usual");
  if (o.growth_interval < 1)
    raise<InvalidArgument>("loss scale: growth_interval = ", o.growth_interval,
                           " must be at least 1 step; 2000 is usual");
  state_.scale = o.initial_scale;
}

void LossScaler::load_state(const LossScaleState& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale) || s.good_steps < 0 || s.skipped_steps < 0)
    raise<InvalidArgument>("loss scale state (scale ", s.scale, ", good steps ", s.good_steps,
                           ", skipped steps ", s.skipped_steps,
                           ") is not valid: the scale must be positive and finite, the counts >= 0");
  state_ = s;
}

bool LossScaler::update(bool finite) {
  last_skipped_ = !finite;
  if (!finite) {
    // Never down to zero: the smallest positive float keeps the arithmetic defined.
    state_.scale = std::max(state_.scale * options_.backoff_factor,
                            static_cast<double>(std::numeric_limits<float>::min()));
    state_.good_steps = 0;
    state_.skipped_steps += 1;
    return false;
  }
  if (++state_.good_steps >= options_.growth_interval) {
    const double grown = state_.scale * options_.growth_factor;
    // Growth stops where the scale itself would overflow fp32.
    if (grown < static_cast<double>(std::numeric_limits<float>::max())) state_.scale = grown;
    state_.good_steps = 0;
  }
  return true;
}

std::string LossScaler::describe() const {
  return str("dynamic loss scaling from ", state_.scale, " (x", options_.growth_factor, " after ",
             options_.growth_interval, " good steps, x", options_.backoff_factor,
             " on inf/NaN, which skips the step)");
}

}  // namespace towerflow::tower
