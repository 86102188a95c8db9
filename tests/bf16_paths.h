#pragma once
// Test helper: the bf16 kernel paths this CPU runs (core/cpu/bf16.h) -- the emulated one always,
// oneDNN's where it has JIT bf16 kernels here (a WARN says why not elsewhere) -- and a guard that
// puts the automatic choice back however the test ends.

#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "core/cpu/bf16.h"
#include "core/error.h"

namespace towerflow::testing {

inline std::vector<cpu::Bf16Kernels> bf16_paths() {
  std::vector<cpu::Bf16Kernels> paths{cpu::Bf16Kernels::Emulated};
  try {
    cpu::force_bf16_kernels_for_testing(cpu::Bf16Kernels::OneDnn);
    paths.push_back(cpu::Bf16Kernels::OneDnn);
  } catch (const DeviceError& e) {
    WARN("oneDNN's bf16 kernels are not tested here: " << e.what());
  }
  cpu::force_bf16_kernels_for_testing(std::nullopt);
  return paths;
}

struct AutomaticBf16Kernels {
  AutomaticBf16Kernels() = default;
  AutomaticBf16Kernels(const AutomaticBf16Kernels&) = delete;
  AutomaticBf16Kernels& operator=(const AutomaticBf16Kernels&) = delete;
  ~AutomaticBf16Kernels() { cpu::force_bf16_kernels_for_testing(std::nullopt); }
};

}  // namespace towerflow::testing
