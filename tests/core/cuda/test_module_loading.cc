// Device probing fixes CUDA's module loading mode before the first CUDA call (Note [Eager CUDA
// module loading]): CUDA_MODULE_LOADING=EAGER, unless the environment already had a value, which
// is kept. CTest runs this twice (tests/core/cuda/CMakeLists.txt): with the variable unset, and
// with CUDA_MODULE_LOADING=LAZY. It runs on machines without a GPU too, where probing finds none.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <string>

#include "core/cuda/status.h"
#include "core/platform/platform.h"

namespace tw = towerflow;

TEST_CASE("device probing sets CUDA_MODULE_LOADING=EAGER before the first CUDA call, and keeps "
          "a value the user set", "[cuda][module_loading]") {
  const char* before = std::getenv("CUDA_MODULE_LOADING");
  const std::optional<std::string> preset =
      before ? std::optional<std::string>(before) : std::nullopt;
  // The process's first CUDA calls: listing GPUs (cudaGetDeviceCount), then the availability
  // query. Without a GPU or driver both answer "none" without throwing.
  auto platform = tw::make_system_platform();
  const auto gpus = platform->gpus();
  const tw::gpu::CudaAvailability a = tw::gpu::cuda_availability();
  INFO("GPUs listed: " << gpus.size() << "; " << tw::gpu::describe(a));
  CHECK(static_cast<int>(gpus.size()) == a.device_count);
  const char* after = std::getenv("CUDA_MODULE_LOADING");
  REQUIRE(after != nullptr);
  CHECK(std::string(after) == preset.value_or("EAGER"));
}
