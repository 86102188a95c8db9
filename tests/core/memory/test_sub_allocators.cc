#include <catch2/catch.hpp>

#include "test_skip.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/memory/memory.h"

namespace tw = towerflow;

TEST_CASE("the host sub-allocator gives page-aligned, writable regions", "[memory]") {
  auto sub = tw::make_host_sub_allocator();
  CHECK(sub->name() == "host");
  void* p = sub->alloc(1 << 20);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  std::memset(p, 0xAB, 1 << 20);
  CHECK(static_cast<unsigned char*>(p)[(1 << 20) - 1] == 0xAB);
  sub->free(p, 1 << 20);
  CHECK(sub->alloc(0) == nullptr);
  CHECK(sub->alloc(static_cast<std::size_t>(-1)) == nullptr);  // refused, not thrown
}

TEST_CASE("a BFC pool over host memory serves writable memory", "[memory]") {
  auto a = tw::make_bfc_allocator(tw::make_host_sub_allocator(),
                                  {.device_name = "/cpu:0", .limit_bytes = 64 << 20});
  CHECK(a->name() == "/cpu:0 BFC over host");
  auto* p = static_cast<float*>(a->allocate(1000 * sizeof(float)));
  for (int i = 0; i < 1000; ++i) p[i] = static_cast<float>(i);
  CHECK(p[999] == 999.0f);
  a->deallocate(p);
}

#ifndef TOWERFLOW_HAVE_CUDA
TEST_CASE("without CUDA the CUDA sub-allocators say how to get them", "[memory]") {
  try {
    tw::make_cuda_sub_allocator(0);
    FAIL("no throw");
  } catch (const tw::DeviceError& e) {
    CHECK(std::string(e.what()).find("rebuild with -DTOWERFLOW_CUDA=ON") != std::string::npos);
  }
  CHECK_THROWS_AS(tw::make_pinned_host_sub_allocator(), tw::DeviceError);
  CHECK_THROWS_AS(tw::make_cuda_sub_allocator(-1), tw::InvalidArgument);
}
#endif

#ifdef TOWERFLOW_HAVE_CUDA
TEST_CASE("cudaMalloc and cudaHostAlloc pools, where a GPU exists", "[memory][cuda]") {
  std::unique_ptr<tw::SubAllocator> sub;
  try {
    sub = tw::make_cuda_sub_allocator(0);
  } catch (const tw::Error& e) {
    TW_SKIP("no usable CUDA device (" << e.what() << ")");
  }
  CHECK(sub->name() == "cudaMalloc");
  CHECK_THROWS_AS(tw::make_cuda_sub_allocator(4096), tw::InvalidArgument);
  auto gpu = tw::make_bfc_allocator(std::move(sub), {.device_name = "/gpu:0", .limit_bytes = 64 << 20,
                                                     .allow_growth = true});
  void* a = gpu->allocate(1 << 20);
  void* b = gpu->allocate(3 << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  CHECK(a != b);
  CHECK(gpu->stats().bytes_in_use == (4 << 20));
  gpu->deallocate(a);
  gpu->deallocate(b);
  CHECK(gpu->release_free_regions() > 0);
  // A region larger than the device is refused, not thrown: the pool reports out-of-memory.
  auto huge = tw::make_bfc_allocator(tw::make_cuda_sub_allocator(0),
                                     {.device_name = "/gpu:0", .limit_bytes = std::size_t{1} << 50});
  CHECK_THROWS_AS(huge->allocate(std::size_t{1} << 49), tw::OutOfMemory);

  auto pinned = tw::make_bfc_allocator(tw::make_pinned_host_sub_allocator(),
                                       {.device_name = "/cpu:0 (pinned)", .limit_bytes = 16 << 20});
  CHECK(pinned->name() == "/cpu:0 (pinned) BFC over cudaHostAlloc");
  auto* p = static_cast<unsigned char*>(pinned->allocate(4096));
  std::memset(p, 7, 4096);
  CHECK(p[4095] == 7);
  pinned->deallocate(p);
}
#endif
