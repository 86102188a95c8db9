#pragma once
// CheckpointDir: the checkpoints of one training run, kept in a directory (the trainer's
// --train_dir), each a subdirectory "ckpt-<step, 10 digits>" holding the files of one checkpoint.
//
// Contract:
// - save() writes every file of a checkpoint into a temporary directory, fsyncs each file and
//   the directory, renames it into place and fsyncs the parent: a checkpoint is there whole or
//   not at all, whenever the process dies. Saving a step that already exists replaces it
//   atomically (renameat2 RENAME_EXCHANGE), so the old one stays until the new one is complete.
//   Then only the newest `keep` checkpoints remain (keep <= 0 keeps all); pruning happens after
//   the new one is durable, so a crash never leaves fewer than before.
// - list() and latest() see only complete checkpoints; temporaries from an interrupted save are
//   ignored, and remove_stale() deletes them.
// - Errors: DataError naming the path and the reason (permissions, a full disk).
// A CheckpointDir is not synchronised: one writer per directory (the training process).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace towerflow::io {

struct CheckpointInfo {
  std::int64_t step = 0;
  std::filesystem::path path;  // the checkpoint's directory
};

class CheckpointDir {
 public:
  // Creates `dir` (and parents) if missing; DataError if it cannot.
  explicit CheckpointDir(std::filesystem::path dir);

  const std::filesystem::path& path() const { return dir_; }

  // Complete checkpoints, oldest (smallest step) first.
  std::vector<CheckpointInfo> list() const;
  std::optional<CheckpointInfo> latest() const;

  // Writes one checkpoint: (file name, bytes) pairs. Returns its directory.
  std::filesystem::path save(std::int64_t step,
                             const std::vector<std::pair<std::string, std::string>>& files,
                             int keep);

  // Deletes all but the newest `keep` checkpoints (keep <= 0: none). Returns how many went.
  int prune(int keep);

  // Deletes these checkpoints (each renamed to a temporary first, so a crash never leaves a
  // half-deleted one that looks whole). Returns how many went.
  int remove(const std::vector<CheckpointInfo>& checkpoints);

  // Deletes temporaries left by interrupted saves. Returns how many went.
  int remove_stale();

  static std::string name_for_step(std::int64_t step);  // "ckpt-0000001200"
  // The step of a checkpoint directory name, or nullopt if it is not one.
  static std::optional<std::int64_t> step_of(const std::filesystem::path& path);

 private:
  std::filesystem::path dir_;
};

}  // namespace towerflow::io
