#pragma once
// Helpers for the trainer tests: tiny runs on a small built-in dataset, temporary train_dirs,
// and reading checkpoints back.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "examples/cifar10/train_options.h"
#include "io/atomic_file.h"
#include "train/fit_test_util.h"

namespace towerflow::cifar10::testing {

using train::testing::fresh_devices;
using train::testing::jsonl;
using train::testing::Output;
using train::testing::steps_in;
using train::testing::tensors_of;
using train::testing::TempDir;

// A run of a few steps: 128 training and 64 test images, batch 32 over the two CPU towers.
// An image folder under `root`: class0/ .. class<classes-1>/, each with `per_class` grey 32x32
// PNGs named 0.png, 1.png, ...
inline void write_image_folder(const std::filesystem::path& root, int classes, int per_class) {
  const auto png = data::encode_png({.h = 32, .w = 32, .c = 3, .pixels = std::vector<std::uint8_t>(32 * 32 * 3, 90)});
  for (int cls = 0; cls < classes; ++cls) {
    const std::filesystem::path d = root / ("class" + std::to_string(cls));
    std::filesystem::create_directories(d);
    for (int i = 0; i < per_class; ++i)
      io::write_file_atomically(d / (std::to_string(i) + ".png"), std::string(png.begin(), png.end()));
  }
}

inline TrainOptions tiny_options(const std::filesystem::path& train_dir) {
  TrainOptions o;
  o.builtin_train_size = 128;
  o.builtin_test_size = 64;
  o.batch_size = 32;
  o.epochs = 2;
  o.lr = 0.02;
  o.eval_every = 1;
  o.log_every = 2;
  o.save_every = 3;
  o.keep_checkpoints = 2;
  o.loader_threads = 0;
  o.train_dir = train_dir.string();
  o.devices = "/cpu:0,/cpu:1";
  return o;
}

#ifdef TW_CIFAR10_TRAIN_BIN
// Starts `program` with the arguments, its output (stdout and stderr) going to `log`.
inline pid_t spawn_trainer(const std::vector<std::string>& args, const std::filesystem::path& log,
                           const std::string& program = TW_CIFAR10_TRAIN_BIN) {
  std::vector<std::string> all{program};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return pid;
}

// Its exit status, or minus the signal that ended it.
inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

#endif

}  // namespace towerflow::cifar10::testing
