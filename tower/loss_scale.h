#pragma once
// Dynamic loss scaling for fp16 (PyTorch's GradScaler, TensorFlow's LossScaleOptimizer).
//
// fp16 operands flush gradients below 2^-24 to zero. So under fp16 the trainer multiplies the loss
// by a scale S before backward, which lifts the small gradients into fp16's range, and divides the
// reduced gradients by S before the optimizer sees them. When a step's reduced gradients hold an
// infinity or a NaN (the scale was too large, or the step really overflowed), the step is
// skipped -- the optimizer leaves parameters, state and its step count alone -- and S is
// multiplied by backoff_factor; after growth_interval steps in a row without one, S is
// multiplied by growth_factor.
//
// Contract:
// - The reduced gradients are the same on every tower and process, so every replica makes the
//   same decision without talking to the others.
// - LossScaler is a plain state machine, driven by one thread (the trainer's caller). Its state
//   goes into checkpoints (train/fit.cc), so a resumed run continues with the same scale.
// - InvalidArgument for options that cannot work, naming the field and the fix.

#include <cstdint>
#include <string>

namespace towerflow::tower {

struct LossScaleOptions {
  double initial_scale = 65536.0;  // 2^16, as PyTorch's GradScaler
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int growth_interval = 2000;      // good steps in a row before the scale grows; >= 1
};

struct LossScaleState {
  double scale = 65536.0;
  std::int64_t good_steps = 0;     // since the last growth or back-off
  std::int64_t skipped_steps = 0;  // since the run began
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options = {});

  double scale() const { return state_.scale; }
  const LossScaleState& state() const { return state_; }
  void load_state(const LossScaleState& s);  // InvalidArgument for a scale that is not positive
  const LossScaleOptions& options() const { return options_; }

  // After a step's reduction: finite says whether every reduced gradient was finite. Returns
  // whether the optimizer should apply the step.
  bool update(bool finite);
  bool last_step_skipped() const { return last_skipped_; }

  // "dynamic loss scaling from 65536 (x2 after 2000 good steps, x0.5 on inf/NaN)"
  std::string describe() const;

 private:
  LossScaleOptions options_;
  LossScaleState state_;
  bool last_skipped_ = false;
};

}  // namespace towerflow::tower
