// What the CUDA backend promises without a GPU: a build without CUDA raises the stub's clear
// error everywhere; a CUDA build on a machine without a driver or device says "no GPU" cleanly
// (a DeviceError with the reason, never a crash or an InternalError).

#include <catch2/catch.hpp>

#include "test_skip.h"

#include <string>
#include <vector>

#include "core/cuda/copy.h"
#include "core/cuda/ops.h"
#include "core/cuda/optimizer_kernels.h"
#include "core/cuda/status.h"
#include "core/memory/allocator.h"
#include "core/tensor/backend_impl.h"

namespace tw = towerflow;
namespace gpu = towerflow::gpu;
using Catch::Matchers::Contains;

namespace {

// An allocator that is never asked for memory: the context must fail before using it.
class NoMemory : public tw::Allocator {
 public:
  void* allocate(std::size_t) override { FAIL("allocate called"); return nullptr; }
  void deallocate(void*) override {}
  tw::AllocatorStats stats() const override { return {}; }
  void reset_peak() override {}
  std::string name() const override { return "none"; }
};

}  // namespace

TEST_CASE("cuda_availability never throws and explains a missing GPU", "[cuda-nogpu]") {
  gpu::CudaAvailability a;
  REQUIRE_NOTHROW(a = gpu::cuda_availability());
  CHECK(a.built == gpu::built_with_cuda());
  if (!a.usable()) {
    CHECK(a.device_count == 0);
    CHECK_FALSE(a.reason.empty());
    INFO("reason: " << a.reason);
    CHECK(gpu::describe(a).find(a.reason) != std::string::npos);
  } else {
    CHECK(a.reason.empty());
    CHECK(a.runtime_version > 0);
  }
  if (!a.built) {
    CHECK(a.reason == gpu::kNoCudaBuildMessage);
    CHECK(a.runtime_version == 0);
  }
}

TEST_CASE("a GPU context where none can exist is a DeviceError naming the device",
          "[cuda-nogpu]") {
  const gpu::CudaAvailability a = gpu::cuda_availability();
  NoMemory memory;
  if (a.usable()) {
    // With a GPU, an ordinal the driver does not show is the user's mistake.
    gpu::GpuContextOptions opts{.device = tw::Device::gpu(5), .ordinal = a.device_count + 3,
                                .allocator = &memory};
    REQUIRE_THROWS_AS(gpu::GpuContext(opts), tw::InvalidArgument);
    REQUIRE_THROWS_WITH(gpu::GpuContext(opts), Contains("CUDA ordinal " +
                                                        std::to_string(a.device_count + 3)) &&
                                                   Contains("/gpu:5"));
    return;
  }
  gpu::GpuContextOptions opts{.device = tw::Device::gpu(1), .ordinal = 0, .allocator = &memory};
  REQUIRE_THROWS_AS(gpu::GpuContext(opts), tw::DeviceError);
  try {
    gpu::GpuContext ctx(opts);
    FAIL("GpuContext constructed without a GPU");
  } catch (const tw::DeviceError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Contains("/gpu:1"));
    if (!a.built) CHECK_THAT(what, Contains(std::string(gpu::kNoCudaBuildMessage)));
  }
}

TEST_CASE("context_for a device without a GPU backend is an error naming it", "[cuda-nogpu]") {
  if (!gpu::built_with_cuda()) TW_SKIP("a build without CUDA (its stub's errors are tested below)");
  REQUIRE_THROWS_AS(gpu::context_for(tw::Device::gpu(7)), tw::NotFound);
  REQUIRE_THROWS_WITH(gpu::context_for(tw::Device::gpu(7)), Contains("/gpu:7"));
}

TEST_CASE("a GPU context without an allocator is an InvalidArgument", "[cuda-nogpu]") {
  if (!gpu::built_with_cuda()) TW_SKIP("a build without CUDA (its stub fails earlier, tested above)");
  gpu::GpuContextOptions opts{.device = tw::Device::gpu(0), .ordinal = 0, .allocator = nullptr};
  REQUIRE_THROWS_AS(gpu::GpuContext(opts), tw::InvalidArgument);
  REQUIRE_THROWS_WITH(gpu::GpuContext(opts), Contains("allocator"));
}

TEST_CASE("the stub backend fails every entry point with the rebuild hint", "[cuda-nogpu]") {
  if (gpu::built_with_cuda()) TW_SKIP("a CUDA build has no stub backend");
  const std::string hint(gpu::kNoCudaBuildMessage);
  REQUIRE_THROWS_WITH(gpu::PinnedBuffer(16), Contains(hint));
  REQUIRE_THROWS_AS(gpu::PinnedBuffer(16), tw::DeviceError);
  REQUIRE_THROWS_WITH(gpu::can_access_peer(0, 1), Contains(hint) && Contains("can_access_peer"));
  // Kernels are reachable only through a context, which cannot be made; their definitions still
  // exist and fail the same way (the linker would reject a missing one).
  NoMemory memory;
  REQUIRE_THROWS_WITH(
      gpu::GpuContext(gpu::GpuContextOptions{.device = tw::Device::gpu(0), .allocator = &memory}),
      Contains(hint) && Contains("/gpu:0"));
  CHECK(gpu::describe(gpu::cuda_availability()) == hint);
  REQUIRE_THROWS_AS(gpu::context_for(tw::Device::gpu(0)), tw::DeviceError);
  REQUIRE_THROWS_WITH(gpu::context_for(tw::Device::gpu(0)), Contains(hint));
}

TEST_CASE("a GPU backend where no GPU exists fails with an error naming the device",
          "[cuda-nogpu]") {
  if (gpu::cuda_availability().usable()) TW_SKIP("a GPU is here: the parity suite covers it");
  NoMemory memory;
  // Without CUDA: the stub's rebuild hint. With CUDA but no driver or device: the registry has
  // no /gpu:0 and says so (NotFound), before any CUDA call.
  try {
    if (gpu::built_with_cuda()) {
      (void)tw::backend_for(tw::Device::gpu(0));
    } else {
      (void)tw::make_gpu_backend(tw::Device::gpu(0), 0, memory);
    }
    FAIL("a GPU backend was made without a GPU");
  } catch (const tw::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Contains("/gpu:0"));
    if (!gpu::built_with_cuda()) {
      CHECK(dynamic_cast<const tw::DeviceError*>(&e) != nullptr);
      CHECK_THAT(what, Contains(std::string(gpu::kNoCudaBuildMessage)));
    }
  }
}
