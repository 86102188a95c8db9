#pragma once
// Training checkpoints: everything a resumed run needs to continue as if it had never stopped.
//
// A checkpoint is a directory train_dir/ckpt-<step> (io::CheckpointDir: written whole or not at
// all) holding
//   model.safetensors        parameters and buffers under the PyTorch state_dict names, loadable
//                            with safetensors.torch.load_file + load_state_dict
//   train_state.safetensors  the optimizer state ("<param>.momentum_buffer", "<param>.exp_avg",
//                            ... shaped like the parameter) and, as metadata: step, epoch,
//                            step_in_epoch, optimizer_step, seed, the model, the towers, the
//                            options (JSON) that made the run, and under fp16 the loss scaler's
//                            state (loss_scale, loss_scale_good_steps, loss_scale_skipped_steps).
//   hook_state.safetensors   only where a run's hooks keep tensors (train::Hook::save_tensors: a
//                            weight average), under the hooks' names, 1-D float32.
// The data order and augmentation are pure functions of (seed, epoch, index), so (seed, epoch,
// step_in_epoch) is the whole random state of the input pipeline.
//
// Both files record a CRC-32C of every tensor in their metadata ("towerflow.crc32c.<name>",
// io/safetensors.h); reading a file verifies them, so a checkpoint whose bytes changed on disk
// raises DataError naming the file, the tensor and both checksums. A checkpoint written before
// checksums existed loads as before, with one log note that it carries none.
//
// Loading validates both files against the model and the optimizer before changing either:
// a missing, extra or differently shaped tensor, or a missing or malformed metadata field, raises
// DataError naming it; then nothing was loaded.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "tower/loss_scale.h"

namespace towerflow::train {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kStateFile = "train_state.safetensors";
inline constexpr const char* kHookStateFile = "hook_state.safetensors";

struct TrainingPosition {
  std::int64_t step = 0;           // optimizer steps done
  std::int64_t epoch = 0;          // the epoch the next step belongs to
  std::int64_t step_in_epoch = 0;  // the next step's index within that epoch
};

struct CheckpointInfo {
  TrainingPosition position;
  io::Metadata metadata;  // train_state.safetensors' metadata (model, seed, options, ...)
};

// Writes a checkpoint of model (replica 0), optimizer and, under fp16, the trainer's loss scaler
// (null: none) at `position`, then keeps the newest `keep`. `metadata` is added to train_state's
// metadata (model name, seed, options JSON...); hook_tensors (none: no file) go to hook_state.
std::filesystem::path save_checkpoint(io::CheckpointDir& dir, const nn::Module& model,
                                      const optim::Optimizer& optimizer, const TrainingPosition& position,
                                      const io::Metadata& metadata, int keep,
                                      const tower::LossScaler* loss_scaler = nullptr,
                                      const std::vector<optim::NamedState>& hook_tensors = {});

// The hook tensors of a checkpoint directory (empty when it has no hook_state file), checksums
// verified: DataError naming the file otherwise.
std::vector<optim::NamedState> load_hook_tensors(const std::filesystem::path& checkpoint);

// Reads the metadata of a checkpoint directory without loading tensors (cheap validation first).
CheckpointInfo read_checkpoint_info(const std::filesystem::path& checkpoint);

// Reads both files of a checkpoint directory completely, as load_checkpoint would: parses them,
// verifies every tensor's checksum and the position metadata. DataError (or NotFound for a
// missing file) naming the file and what is wrong; returns the metadata and whether the
// checkpoint carries checksums (one without is not verified beyond its structure).
struct VerifiedCheckpoint {
  CheckpointInfo info;
  bool checksummed = false;
};
VerifiedCheckpoint verify_checkpoint(const std::filesystem::path& checkpoint);

// Loads a checkpoint into model, optimizer and loss scaler (null: none), all or nothing (see
// above). A checkpoint without a loss scale (written by an fp32 or bf16 run) leaves the scaler
// as it is and says so in a log line.
CheckpointInfo load_checkpoint(const std::filesystem::path& checkpoint, nn::Module& model,
                               optim::Optimizer& optimizer, tower::LossScaler* loss_scaler = nullptr);

// The checkpoint a resumed run starts from by default: the newest intact one in train_dir, each
// read whole, checksums included, newest first (Note [Resume from the newest intact checkpoint]
// in checkpoint.cc); the ones passed over are named in a warning each, or, where `passed_over` is
// given, put there instead. nullopt when train_dir holds no checkpoint (or does not exist);
// DataError listing them when every one is damaged.
std::optional<io::CheckpointInfo> newest_intact_checkpoint(const std::filesystem::path& train_dir,
                                                           std::vector<std::string>* passed_over = nullptr);

// One checkpoint of train_dir, named as a user names it: its directory name (ckpt-0000000200),
// the short form ckpt-200, the step (200), or a path to that directory. NotFound naming what was
// asked for and the checkpoints there; InvalidArgument for a path to a directory outside train_dir
// (a run continues in its own train_dir: copy the checkpoint there, or start from its weights).
io::CheckpointInfo find_checkpoint(const std::filesystem::path& train_dir, const std::string& which);

// For evaluation: resolves `path` (a checkpoint directory, a train_dir holding checkpoints (the
// latest), or a .safetensors file) to the model file, loads it into model, and returns the
// checkpoint's metadata if it has a train_state (empty otherwise). NotFound when nothing is there.
std::filesystem::path resolve_model_file(const std::filesystem::path& path);

}  // namespace towerflow::train
