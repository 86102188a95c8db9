#pragma once
// Private helpers shared by the CPU kernels (conv, pool, batch norm, GEMM): 8- and 16-lane float
// vectors and per-thread scratch buffers. Not part of the public API.
//
// The vector types use GCC/Clang vector extensions rather than intrinsics so that the same code
// compiles to AVX2+FMA (or AVX-512) with -march=native and to paired SSE instructions on a
// portable build; the kernel library is compiled with -ffp-contract=fast so that `acc += a * b`
// becomes an FMA.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

// Each instruction set's build of the kernels has a namespace of its own (isa.h), so that the
// inline functions here, compiled differently for each, never meet.
#ifndef TW_ISA
#define TW_ISA generic
#endif

namespace towerflow::cpu::TW_ISA::detail {

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

// A 16-lane float vector: one zmm register where the build targets AVX-512, otherwise split by
// the compiler into narrower registers (correct, but slower than Vec8), so kernels use it only
// when kWideLanes says the target has it.
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec16Unaligned __attribute__((vector_size(64), aligned(4), may_alias));
inline Vec16 load16(const float* p) { return *reinterpret_cast<const Vec16Unaligned*>(p); }
inline void store16(float* p, Vec16 v) { *reinterpret_cast<Vec16Unaligned*>(p) = v; }
inline Vec16 splat16(float s) { return Vec16{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

// The widest vector the build's target executes natively: 16 with AVX-512F (32 zmm registers),
// else 8. TW_WIDE_LANES=16 makes it 16 on a narrower target, where each Vec16 is split: the test
// build of core/cpu/CMakeLists.txt (towerflow_cpu_kernels_wide_lanes) that runs the AVX-512
// kernels' 16-lane code paths on an AVX2 CPU, so that their results are checked on every machine.
#if defined(__AVX512F__) || (defined(TW_WIDE_LANES) && TW_WIDE_LANES == 16)
constexpr int kWideLanes = 16;
#else
constexpr int kWideLanes = 8;
#endif

// Vec<8> and Vec<16>: the vector of L lanes with its load, store and splat, for kernels written
// once for either width.
template <int L>
struct Vec;
template <>
struct Vec<8> {
  using type = Vec8;
  static Vec8 load(const float* p) { return load8(p); }
  static void store(float* p, Vec8 v) { store8(p, v); }
  static Vec8 splat(float s) { return splat8(s); }
};
template <>
struct Vec<16> {
  using type = Vec16;
  static Vec16 load(const float* p) { return load16(p); }
  static void store(float* p, Vec16 v) { store16(p, v); }
  static Vec16 splat(float s) { return splat16(s); }
};

// Int32 vectors of L lanes: the masks that comparisons of Vec<L> give, and indices beside them.
typedef std::int32_t Vec16i __attribute__((vector_size(64)));
typedef std::int32_t Vec16iUnaligned __attribute__((vector_size(64), aligned(4), may_alias));
template <int L>
struct IVec;
template <>
struct IVec<8> {
  using type = Vec8i;
  static Vec8i load(const std::int32_t* p) { return *reinterpret_cast<const Vec8iUnaligned*>(p); }
  static void store(std::int32_t* p, Vec8i v) { *reinterpret_cast<Vec8iUnaligned*>(p) = v; }
  static Vec8i splat(std::int32_t s) { return splat8i(s); }
};
template <>
struct IVec<16> {
  using type = Vec16i;
  static Vec16i load(const std::int32_t* p) { return *reinterpret_cast<const Vec16iUnaligned*>(p); }
  static void store(std::int32_t* p, Vec16i v) { *reinterpret_cast<Vec16iUnaligned*>(p) = v; }
  static Vec16i splat(std::int32_t s) { return Vec16i{} + s; }
};

// Note [Streaming stores]
// A kernel that writes an output larger than the caches (tfcnn's pool1 gradient: 32 MiB at batch
// 128) pays for each written line twice with plain stores: the line is read from memory before
// it is written (write-allocate), and the output then pushes its own input out of the caches.
// Non-temporal stores write whole lines to memory without reading them. The consumer reads the
// output from memory either way, since it no longer fits in the caches by the time it is read.
// Pool gradients and the max pool's argmax (pool.cc) and large transposes (elementwise.cc) are
// written this way. On a
// 2-core Zen 4 EPYC, tfcnn's two max-pool gradients took 1.73-1.96 ms per training step against
// 2.14-2.36 with plain stores (`towerflow_bench_train --model tfcnn --trace`, three alternating
// runs of 10 steps each).
// store_streaming needs p aligned to the build's native vector (64 bytes covers all); a thread
// that used it ends its part with stream_fence(), so that its stores are visible before
// parallel_for reports the part done.
inline constexpr std::size_t kStreamingAlignment = 64;
inline bool streaming_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % kStreamingAlignment == 0;
}

// The bits of v (a 32- or 64-byte vector: Vec8, Vec16 or their int32 twins) stored at p, which
// holds the same element type.
template <typename T, typename V>
inline void store_streaming(T* p, V v) {
  static_assert(sizeof(V) == 32 || sizeof(V) == 64);
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return _mm512_stream_si512(reinterpret_cast<__m512i*>(p), reinterpret_cast<const __m512i&>(v));
#endif
#if defined(__AVX__)
  for (std::size_t i = 0; i < sizeof(V) / 32; ++i)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p) + i, reinterpret_cast<const __m256i*>(&v)[i]);
#elif defined(__SSE2__)
  for (std::size_t i = 0; i < sizeof(V) / 16; ++i)
    _mm_stream_si128(reinterpret_cast<__m128i*>(p) + i, reinterpret_cast<const __m128i*>(&v)[i]);
#else
  std::memcpy(p, &v, sizeof(V));
#endif
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Per-thread scratch that grows to the largest request and is then reused, so steady-state
// kernel calls do not allocate. Each slot is an independent buffer; a kernel uses distinct slots
// for buffers that are alive at the same time on the same thread. The returned memory is
// 64-byte aligned and uninitialised; it stays valid until the same thread asks for the same
// slot again.
enum class Scratch : int { kWeights = 0, kInput, kOutput, kAux, kPacked, kRows, kCount };

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

}  // namespace towerflow::cpu::TW_ISA::detail
