#include <catch2/catch.hpp>

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
