#pragma once
// Helpers for the trainer tests: tiny runs on a small built-in dataset, temporary train_dirs,
// and reading checkpoints back.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/platform/registry.h"
#include "core/tensor/backend_impl.h"
#include "examples/cifar10/reporter.h"
#include "examples/cifar10/train_options.h"
#include "io/safetensors.h"

namespace towerflow::cifar10::testing {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("towerflow-train-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Device options are process-wide: every test starts from the trainer's default on a machine
// without a GPU (two logical CPU devices). No tensor may be alive when this is called.
inline void fresh_devices() {
  reset_backends_for_testing();  // backends hold the allocators the registry is about to destroy
  reset_devices_for_testing();
  initialise_devices(ProcessOptions{.device_count = {{"CPU", 2}}});
}

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

// Output captured in a temporary file (the reporter writes JSON lines there).
struct Output {
  std::FILE* file = std::tmpfile();
  ~Output() { std::fclose(file); }
  ReporterOptions reporter_options() const { return {.json = true, .out = file}; }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) out.append(buf, n);
    return out;
  }
};

// Every tensor of a safetensors file as raw bytes, by name.
inline std::map<std::string, std::vector<std::byte>> tensors_of(const std::filesystem::path& file) {
  auto f = io::SafetensorsFile::load(file);
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& e : f.entries()) {
    auto d = f.data(e);
    out[e.name].assign(d.begin(), d.end());
  }
  return out;
}

}  // namespace towerflow::cifar10::testing
