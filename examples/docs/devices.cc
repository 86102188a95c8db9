// docs/devices.md: process options from an INI file, the logical devices they give, and a
// device's allocator. Usage: doc_devices [train.ini] (default: writes a two-CPU-device file).
#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/memory/memory.h"
#include "core/platform/registry.h"

namespace tw = towerflow;

int main(int argc, char** argv) {
  if (argc < 2) std::ofstream("train.ini") << "[cpu]\ndevice_count = CPU=2\n";
  std::string path = argc > 1 ? argv[1] : "train.ini";
  // [docs:in-code]
  auto opts = tw::ProcessOptions::from_ini(path);
  auto devices = tw::logical_devices(opts);            // every logical GPU, else every CPU device
  tw::Allocator& a = tw::device_allocator(devices[0]); // created on first use, with the device's limit
  int threads = tw::device_info(tw::Device::cpu(0)).intra_op_threads;
  // [end]
  for (const auto& d : devices) std::cout << d.str() << "\n";
  std::cout << tw::format_stats(a.stats()) << "\nintra-op threads of /cpu:0: " << threads << "\n";
}
