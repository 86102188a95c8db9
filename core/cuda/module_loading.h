#pragma once
// Private to core/cuda and core/platform: CUDA's module loading mode, fixed before the process's
// first CUDA runtime call.
//
// Contract: load_cuda_modules_eagerly() sets CUDA_MODULE_LOADING=EAGER in the environment unless
// it is already set (setenv with overwrite = 0: a value the user exported wins, LAZY included).
// The first call does that; later calls do nothing. Every towerflow entry point that may be the
// process's first CUDA call (device discovery, CUDA availability, a device's allocator and
// context, the free-memory query) calls it first. The driver reads the variable when it
// initialises, so a program that made CUDA calls of its own before towerflow's keeps the mode it
// got then. Includes no CUDA header.
//
// Note [Eager CUDA module loading]
// Since CUDA 12.2 the runtime loads modules lazily on Linux by default (CUDA Programming Guide,
// "Lazy Loading"): a kernel's module is loaded at its first launch. Loading may need a context
// synchronisation, and the guide's "Potential Hazards" warn that code relying on kernels running
// concurrently can then deadlock. A towerflow step does rely on that: with bucketed all-reduce the
// communication thread launches NCCL kernels that spin until their peers arrive while the tower
// thread launches backward kernels for the first time. Eager loading loads every module when the
// context is created, at the cost of start-up time and some device memory for kernels never
// used. setenv is called once, on the thread that first probes CUDA, which in a towerflow program
// is the main thread listing devices before any worker thread starts.

#include <cstdlib>

namespace towerflow::gpu {

inline constexpr const char* kCudaModuleLoadingVariable = "CUDA_MODULE_LOADING";

inline void load_cuda_modules_eagerly() {
  static const bool done = [] {
    ::setenv(kCudaModuleLoadingVariable, "EAGER", /*overwrite=*/0);
    return true;
  }();
  (void)done;
}

}  // namespace towerflow::gpu
