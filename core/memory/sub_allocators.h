#pragma once
// The sub-allocators a BFC pool obtains its regions from.
//
// Contract: each returns nullptr from alloc() when the region cannot be had (the pool then backs
// off, frees empty regions, and only then reports out-of-memory); it never throws from alloc().
// free() takes exactly the pointer and size alloc() returned. A sub-allocator is called only with
// its pool's lock held, so it need not synchronise itself.
//
// make_cuda_sub_allocator(ordinal): device memory from cudaMalloc on the CUDA device with that
// ordinal (as the driver numbers them after CUDA_VISIBLE_DEVICES). The calling thread's current
// device is restored after every call.
// make_pinned_host_sub_allocator(): page-locked host memory from cudaHostAlloc (portable to every
// context), for staging host<->device transfers.
// In a build without CUDA both throw DeviceError ("this build has no CUDA support; rebuild with
// -DTOWERFLOW_CUDA=ON"); make_cuda_sub_allocator throws InvalidArgument for a negative ordinal.

#include <memory>

#include "core/memory/allocator.h"

namespace towerflow {

std::unique_ptr<SubAllocator> make_cuda_sub_allocator(int cuda_ordinal);
std::unique_ptr<SubAllocator> make_pinned_host_sub_allocator();

}  // namespace towerflow
