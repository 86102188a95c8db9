#pragma once
// Helpers for tests of training runs: temporary train_dirs, fresh devices, captured reporter
// output, and reading checkpoints and JSON-lines files back.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/platform/registry.h"
#include "core/tensor/backend_impl.h"
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "train/reporter.h"

namespace towerflow::train::testing {

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

// Output captured in a temporary file (the reporter writes JSON lines there).
struct Output {
  std::FILE* file = std::tmpfile();
  ~Output() { std::fclose(file); }
  ReporterOptions reporter_options() const { return {.progress = Progress::Json, .out = file}; }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) out.append(buf, n);
    return out;
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string l; std::getline(in, l);) out.push_back(l);
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

inline std::vector<nlohmann::json> jsonl(const std::filesystem::path& path) {
  std::istringstream in(io::read_file(path));
  std::vector<nlohmann::json> out;
  for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

inline std::vector<std::int64_t> steps_in(const std::filesystem::path& dir) {
  std::vector<std::int64_t> out;
  for (const auto& c : io::CheckpointDir(dir).list()) out.push_back(c.step);
  return out;
}

}  // namespace towerflow::train::testing
