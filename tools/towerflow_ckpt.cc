// towerflow_ckpt: checks a checkpoint without training.
//
//   towerflow_ckpt verify runs/r20                   every checkpoint of a train_dir
//   towerflow_ckpt verify runs/r20/ckpt-0000000312   one checkpoint (both files)
//   towerflow_ckpt verify model.safetensors          one file
//   towerflow_ckpt info runs/r20/ckpt-0000000312     its position, metadata and tensors
//
// verify reads every file whole and checks its structure and every tensor's CRC-32C
// (io/safetensors.h); it prints one line per checkpoint or file ("ok", "ok, no checksums" for one
// written before towerflow recorded them, or "DAMAGED" and why) and exits 1 if any is damaged or
// the path holds none, 0 otherwise. info exits 1 when the path cannot be read.

#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

namespace tw = towerflow;
namespace fs = std::filesystem;

namespace {

bool is_checkpoint(const fs::path& p) { return fs::is_regular_file(p / tw::train::kModelFile); }

// One checkpoint directory or one file: prints its line, returns whether it is intact.
bool verify_one(const fs::path& p) {
  try {
    if (is_checkpoint(p)) {
      auto v = tw::train::verify_checkpoint(p);
      std::cout << (v.checksummed ? "ok: " : "ok, no checksums (structure only): ") << p.string() << " (step "
                << v.info.position.step << ")\n";
    } else {
      auto f = tw::io::SafetensorsFile::load(p);
      std::cout << (f.checksummed() ? "ok: " : "ok, no checksums (structure only): ") << p.string() << " ("
                << f.entries().size() << " tensors)\n";
    }
    return true;
  } catch (const tw::Error& e) {
    std::cout << "DAMAGED: " << e.what() << "\n";
    return false;
  }
}

int verify(const fs::path& path) {
  if (!fs::exists(path)) {
    std::cerr << "towerflow_ckpt: " << path.string()
              << " does not exist; pass a train_dir, a ckpt-<step> directory or a .safetensors file\n";
    return 1;
  }
  if (fs::is_regular_file(path) || is_checkpoint(path)) return verify_one(path) ? 0 : 1;
  auto all = tw::io::CheckpointDir(path).list();
  if (all.empty()) {
    std::cerr << "towerflow_ckpt: no checkpoint in " << path.string() << " (expected ckpt-<step>/"
              << tw::train::kModelFile << ")\n";
    return 1;
  }
  int damaged = 0;
  for (const auto& c : all) damaged += verify_one(c.path) ? 0 : 1;
  std::cout << all.size() << " checkpoint(s), " << damaged << " damaged\n";
  return damaged ? 1 : 0;
}

void print_file(const tw::io::SafetensorsFile& f) {
  std::cout << f.source() << (f.checksummed() ? "" : " (no checksums)") << "\n";
  for (const auto& [key, value] : f.metadata())
    if (!key.starts_with(tw::io::kChecksumKeyPrefix)) std::cout << "  " << key << " = " << value << "\n";
  for (const auto& e : f.entries()) {
    auto crc = f.metadata().find(std::string(tw::io::kChecksumKeyPrefix) + e.name);
    std::cout << "  " << e.name << "  " << tw::io::to_string(e.dtype) << " " << tw::io::shape_string(e.shape)
              << (crc != f.metadata().end() ? "  crc32c " + crc->second : std::string()) << "\n";
  }
}

int info(const fs::path& path) {
  try {
    if (is_checkpoint(path)) {
      auto v = tw::train::verify_checkpoint(path);
      std::cout << "checkpoint " << path.string() << ": step " << v.info.position.step << ", epoch "
                << v.info.position.epoch << ", step in epoch " << v.info.position.step_in_epoch << "\n";
      print_file(tw::io::SafetensorsFile::load(path / tw::train::kModelFile));
      print_file(tw::io::SafetensorsFile::load(path / tw::train::kStateFile));
    } else {
      print_file(tw::io::SafetensorsFile::load(path));
    }
    return 0;
  } catch (const tw::Error& e) {
    std::cerr << "towerflow_ckpt: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow_ckpt: check towerflow checkpoints without training"};
  app.require_subcommand(1);
  std::string path;
  auto* v = app.add_subcommand("verify", "read every checkpoint (or file) whole and check every tensor's checksum; exit 1 if any is damaged");
  v->add_option("path", path, "a train_dir, a ckpt-<step> directory or a .safetensors file")->required();
  auto* i = app.add_subcommand("info", "print a checkpoint's position, metadata, tensors and checksums");
  i->add_option("path", path, "a ckpt-<step> directory or a .safetensors file")->required();
  CLI11_PARSE(app, argc, argv);
  return v->parsed() ? verify(path) : info(path);
}
