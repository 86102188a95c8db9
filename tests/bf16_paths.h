#pragma once
// Test helper: the bf16 kernel paths this CPU runs (core/cpu/bf16.h) -- the emulated one always;
// oneDNN's where it has JIT bf16 kernels here; towerflow's AMX and AVX512-BF16 kernels where the
// CPU has the instructions, and their twins with them emulated on any AVX-512 CPU (a WARN says why
// a path is not run) -- and a guard that puts the automatic choice back however the test ends.

#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "core/cpu/bf16.h"
#include "core/error.h"

namespace towerflow::testing {

// The path k when this CPU and build run it, else a WARN naming why not.
inline bool bf16_path_runs(cpu::Bf16Kernels k) {
  bool runs = true;
  try {
    cpu::force_bf16_kernels_for_testing(k);
  } catch (const DeviceError& e) {
    WARN("bf16 kernels " << cpu::bf16_kernels_name(k) << " are not tested here: " << e.what());
    runs = false;
  }
  cpu::force_bf16_kernels_for_testing(std::nullopt);
  return runs;
}

inline std::vector<cpu::Bf16Kernels> bf16_paths() {
  std::vector<cpu::Bf16Kernels> paths{cpu::Bf16Kernels::Emulated};
  for (const cpu::Bf16Kernels k : {cpu::Bf16Kernels::OneDnn, cpu::Bf16Kernels::Amx,
                                   cpu::Bf16Kernels::AmxEmulated, cpu::Bf16Kernels::Avx512Bf16,
                                   cpu::Bf16Kernels::Avx512Bf16Emulated})
    if (bf16_path_runs(k)) paths.push_back(k);
  return paths;
}

struct AutomaticBf16Kernels {
  AutomaticBf16Kernels() = default;
  AutomaticBf16Kernels(const AutomaticBf16Kernels&) = delete;
  AutomaticBf16Kernels& operator=(const AutomaticBf16Kernels&) = delete;
  ~AutomaticBf16Kernels() { cpu::force_bf16_kernels_for_testing(std::nullopt); }
};

}  // namespace towerflow::testing
