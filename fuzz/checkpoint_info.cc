// Training-state files (train_dir/ckpt-N/train_state.safetensors, read by --resume and
// cifar10_eval before anything is loaded): train::read_checkpoint_info.
#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"

namespace tw = towerflow;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto dir = tw::fuzz::scratch_dir() / "ckpt-1";
  tw::fuzz::write_file(dir / tw::train::kStateFile, data, size);
  tw::fuzz::expect_user_errors_only([&] {
    tw::train::CheckpointInfo info = tw::train::read_checkpoint_info(dir);
    TW_CHECK(info.position.step >= 0 && info.position.epoch >= 0 && info.position.step_in_epoch >= 0,
             "a negative position: step ", info.position.step, ", epoch ", info.position.epoch);
  });
  return 0;
}
