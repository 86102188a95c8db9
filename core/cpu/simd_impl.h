#pragma once
// Private helpers shared by the CPU kernels (conv, pool, batch norm, GEMM): an 8-lane float
// vector and per-thread scratch buffers. Not part of the public API.
//
// The vector type uses GCC/Clang vector extensions rather than intrinsics so that the same code
// compiles to AVX2+FMA with -march=native and to paired SSE instructions on a portable build;
// the kernel library is compiled with -ffp-contract=fast so that `acc += a * b` becomes an FMA.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

namespace towerflow::cpu::detail {

constexpr int kLanes = 8;
typedef float Vec8 __attribute__((vector_size(32)));
// The same vector with alignment 4 and may_alias: dereferencing it is an unaligned load or store
// (vmovups) that may read any float array.
typedef float Vec8Unaligned __attribute__((vector_size(32), aligned(4), may_alias));

inline Vec8 load8(const float* p) { return *reinterpret_cast<const Vec8Unaligned*>(p); }
inline void store8(float* p, Vec8 v) { *reinterpret_cast<Vec8Unaligned*>(p) = v; }
// Eight int32 lanes: masks from comparisons of Vec8, and indices.
typedef std::int32_t Vec8i __attribute__((vector_size(32)));
typedef std::int32_t Vec8iUnaligned __attribute__((vector_size(32), aligned(4), may_alias));
inline void store8i(std::int32_t* p, Vec8i v) { *reinterpret_cast<Vec8iUnaligned*>(p) = v; }
inline Vec8i splat8i(std::int32_t s) { return Vec8i{s, s, s, s, s, s, s, s}; }

inline Vec8 splat8(float s) { return Vec8{s, s, s, s, s, s, s, s}; }
inline Vec8 max8(Vec8 a, Vec8 b) { return a > b ? a : b; }

// Per-thread scratch that grows to the largest request and is then reused, so steady-state
// kernel calls do not allocate. Each slot is an independent buffer; a kernel uses distinct slots
// for buffers that are alive at the same time on the same thread. The returned memory is
// 64-byte aligned and uninitialised; it stays valid until the same thread asks for the same
// slot again.
enum class Scratch : int { kWeights = 0, kInput, kOutput, kAux, kCount };

inline float* scratch(Scratch slot, std::size_t floats) {
  struct Buffer {
    float* data = nullptr;
    std::size_t size = 0;
    ~Buffer() { ::operator delete[](data, std::align_val_t{64}); }
  };
  thread_local Buffer buffers[static_cast<int>(Scratch::kCount)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.size < floats) {
    ::operator delete[](b.data, std::align_val_t{64});
    // Grow geometrically so that a slowly increasing sequence of shapes settles quickly.
    std::size_t grown = std::max(floats, b.size + b.size / 2);
    b.data = static_cast<float*>(::operator new[](grown * sizeof(float), std::align_val_t{64}));
    b.size = grown;
  }
  return b.data;
}

inline std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

}  // namespace towerflow::cpu::detail
