#pragma once
// Helpers for the trainer tests: tiny runs on a small built-in dataset, temporary train_dirs,
// and reading checkpoints back.

#include <filesystem>

#include "examples/cifar10/train_options.h"
#include "train/fit_test_util.h"

namespace towerflow::cifar10::testing {

using train::testing::fresh_devices;
using train::testing::jsonl;
using train::testing::Output;
using train::testing::steps_in;
using train::testing::tensors_of;
using train::testing::TempDir;

// A run of a few steps: 128 training and 64 test images, batch 32 over the two CPU towers.
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

}  // namespace towerflow::cifar10::testing
