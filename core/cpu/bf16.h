#pragma once
// bf16 convolutions and GEMM on the CPU: fp32 operands in memory, read as bfloat16 (rounded to
// nearest, ties to even, inside the call), products accumulated in fp32, fp32 outputs. So each
// kernel equals its fp32 twin (conv.h, gemm.h) on bf16-rounded operands, up to the order of the
// fp32 sums.
//
// Which kernels: chosen once, at the first call, from what the CPU has (Note [bf16 kernels]):
//   onednn      oneDNN's JIT kernels: AMX tiles on CPUs with AMX (Intel Sapphire Rapids and later),
//               vdpbf16ps on CPUs with AVX512-BF16 (Intel Cooper Lake, AMD Zen 4 and later).
//               oneDNN picks among them at run time, and requests the AMX permission from Linux.
//   amx         towerflow's own kernels on AMX tiles (bf16_amx.cc): on CPUs with AMX-BF16, the
//               automatic choice there in a build without oneDNN.
//   avx512bf16  towerflow's own kernels on vdpbf16ps (bf16_pairs.cc): on CPUs with AVX512-BF16,
//               the automatic choice there in a build without oneDNN (and without AMX).
//   emulated    the fp32 kernels on rounded copies of the operands: on every CPU, slower than fp32.
// TOWERFLOW_BF16_KERNELS=auto|onednn|amx|amx-emulated|avx512bf16|avx512bf16-emulated|emulated
// overrides the choice (auto by default): onednn on a CPU without bf16 instructions runs oneDNN's emulation of them
// (AVX-512 CPUs only; measured slower than the emulated path, Note [bf16 kernels]);
// avx512bf16-emulated runs towerflow's pair kernels with the instruction emulated by AVX-512F
// FMAs, amx-emulated the AMX kernels with the tiles emulated (any AVX-512 CPU; for testing,
// slower than emulated); emulated runs emulated anywhere.
// oneDNN's own ONEDNN_MAX_CPU_ISA (e.g. AVX512_CORE_BF16 on an AMX CPU) lowers the instructions
// it uses. The kernel choice (kernel_choice.h) also measures towerflow's Winograd F(2x2, 3x3)
// kernels on AVX512-BF16 for 3x3 stride-1 layers (the *_bf16_winograd_with calls below).
//
// Contract:
// - The arguments, layouts and overwrite rules of conv.h and gemm.h (alpha = 1, beta = 0).
// - Work runs on ctx.threads() threads (oneDNN's OpenMP threads on the onednn path); the call
//   returns when it is done. Unlike the fp32 kernels, oneDNN's weight gradient with more than one
//   thread may sum in an order that depends on the thread count.
// - Where oneDNN has only a reference kernel for a problem, that problem runs emulated.
// - InvalidArgument for a TOWERFLOW_BF16_KERNELS that names no choice; DeviceError for a choice
//   other than emulated asked of a build or CPU that cannot run it, naming why and the fix.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu/context.h"
#include "core/cpu/conv.h"

namespace towerflow::cpu {

enum class Bf16Kernels { Emulated, OneDnn, Avx512Bf16, Avx512Bf16Emulated, Amx, AmxEmulated };

// x rounded to the nearest bfloat16 (ties to even), as a float; NaN stays NaN, infinities stay
// (towerflow::round_to_bf16 of core/tensor/precision.h).
float round_to_bf16(float x);
// y[i] = round_to_bf16(x[i]) for i < n (y == x allowed): the same rounding, without branches, so
// that the compiler vectorises the loop.
void round_to_bf16(std::int64_t n, const float* x, float* y);

// "emulated", "onednn", "avx512bf16", "avx512bf16-emulated", "amx", "amx-emulated"
const char* bf16_kernels_name(Bf16Kernels k);
// Whether these kernels multiply in bf16 (all but emulated) rather than run
// the fp32 kernels on rounded operands (emulated).
bool bf16_products_in_kernels(Bf16Kernels k);
// The kernels this build has, whether or not this CPU runs them: emulated always, onednn in a
// build with oneDNN, the pair and AMX kernels (and their emulated twins) in an x86-64 build whose
// compiler knows their instructions.
std::vector<Bf16Kernels> built_bf16_kernels();
// The choice the bf16 kernels use (the environment is read once, at the first call).
Bf16Kernels active_bf16_kernels();
// For the start-up block and towerflow_devices, e.g. "oneDNN 2.6.3, avx512_core_amx (AMX tiles)"
// or "emulated (this CPU has no AVX512-BF16 or AMX): operands rounded to bf16 for the fp32
// kernels, slower than fp32".
std::string describe_bf16_kernels();
// oneDNN's instruction set on this CPU ("avx512_core_bf16", ...); empty in a build without oneDNN.
std::string onednn_isa();

// Whether TOWERFLOW_BF16_KERNELS (not auto) or a test fixes the kernels: then no other is tried.
bool bf16_kernels_fixed();
// The kernels this build and CPU run at their full speed, the candidates of a measured choice
// (kernel_choice.h): emulated always; onednn where oneDNN has JIT bf16 kernels here; avx512bf16
// and amx where the CPU has the instructions and the avx512 kernels run. Never the *-emulated
// twins, which are for tests.
std::vector<Bf16Kernels> runnable_bf16_kernels();

// Tests: use these kernels (DeviceError where they cannot run), or nullopt for the automatic
// choice. Not thread-safe with running kernels.
void force_bf16_kernels_for_testing(std::optional<Bf16Kernels> k);

void conv2d_forward_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                         const float* w, const float* bias_or_null, float* y);
void conv2d_backward_input_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                const float* w, float* dx);
void conv2d_backward_weight_bf16(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                 const float* dy, float* dw);
// c[m, n] = op(a) op(b), row-major (gemm.h's arguments with alpha = 1, beta = 0).
void gemm_bf16(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
               const float* a, int lda, const float* b, int ldb, float* c, int ldc);

// The same on the kernels k, one of runnable_bf16_kernels() or the active ones. False, having
// written nothing, where k is onednn and oneDNN has only a reference kernel for the problem.
bool conv2d_forward_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                              const float* x, const float* w, const float* bias_or_null, float* y);
bool conv2d_backward_input_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const float* dy, const float* w, float* dx);
bool conv2d_backward_weight_bf16_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                      const float* x, const float* dy, float* dw);
bool gemm_bf16_with(Bf16Kernels k, const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n,
                    int k_dim, const float* a, int lda, const float* b, int ldb, float* c, int ldc);

// The weight gradient by Winograd's F(2x2, 3x3) on towerflow's kernels k (avx512bf16 or its
// emulated twin; Note [bf16 Winograd weight gradient] in bf16_pairs.cc), x as floats or as bf16
// bits (below): the operands rounded as above, and their transforms rounded to bf16 once more,
// so within the bf16 tolerance of the other kernels rather than their bits. False, having written
// nothing, where k has none (other kernels) or the problem is not a 3x3 stride-1 convolution with
// padding up to 2 and channels in multiples of 8. Candidates of the kernel choice
// ("winograd-avx512bf16"), never the fixed choice.
bool conv2d_backward_weight_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                               const Conv2dShape& s, const float* x,
                                               const float* dy, float* dw);
bool conv2d_backward_weight_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                               const Conv2dShape& s, const std::uint16_t* x,
                                               const float* dy, float* dw);
// The forward and the backward input by the same, the same way (Note [bf16 Winograd
// convolution] in bf16_pairs.cc); the backward input at stride 1 only, as the forward of dy with
// the flipped kernel (a padding of 1 or 2 in the forward is then one of 1 or 0).
bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const float* x, const float* w, const float* bias_or_null,
                                       float* y);
bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, float* y);
bool conv2d_backward_input_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx,
                                              const Conv2dShape& s, const float* dy,
                                              const float* w, float* dx);
// dx += the backward input on kernels k, added as the kernels store it: dx + the result of
// conv2d_backward_input_bf16_with (or its Winograd twin) on the same kernels, rounded once, the
// bits of that result added afterwards. False, having written nothing, where k has no such path:
// oneDNN; and for the Winograd twin, where conv2d_backward_input_bf16_winograd_with declines.
// Whether kernels k have conv2d_backward_input_bf16_add_with's path: all but oneDNN's (the
// emulated path, towerflow's pair and AMX kernels).
bool bf16_backward_input_adds(Bf16Kernels k);
bool conv2d_backward_input_bf16_add_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                         const float* dy, const float* w, float* dx);
bool conv2d_backward_input_bf16_winograd_add_with(Bf16Kernels k, const CpuContext& ctx,
                                                  const Conv2dShape& s, const float* dy,
                                                  const float* w, float* dx);

// ---- the output gradient a few rows at a time ----------------------------------------------
// A convolution's output gradient dy handed to its weight gradient a few rows at a time, made
// while the kernel reads it rather than stored whole first (a max pool's backward, whose gradient
// only the weight gradient reads: Conv2DMaxPoolRelu's first layer). rows(n, row0, count, buf,
// first) gives output rows [row0, row0 + count) of image n, count * out_w * c_out floats: written
// into buf, which has room for them, or anywhere else, and returned. Each row of each image is
// asked for once with first true; where the kernel splits its tiles over threads it asks for the
// rows again, from other threads, with first false, and they must come out the same.
using DyRows = std::function<const float*(int n, int row0, int count, float* buf, bool first)>;

// conv2d_backward_weight_bf16_with with dy read through rows: the same bits as with dy stored.
// False, having written nothing and called rows never, where k has no such path: towerflow's pair
// kernels (avx512bf16 and its emulated twin) have one, except for the row kernel of up to 32
// output channels of 3-wide kernels (Note [Pair weight-gradient row kernel] in bf16_pairs.cc).
bool conv2d_backward_weight_bf16_dy_rows_with(Bf16Kernels k, const CpuContext& ctx,
                                              const Conv2dShape& s, const float* x,
                                              const DyRows& rows, float* dw);

// ---- bf16 inputs ----------------------------------------------------------------------------
// x stored as bf16 bits (the top half of a float32's; batch_norm_relu_forward_training_bf16 of
// batch_norm.h writes them), for the forward and the weight gradient: the same results, bit for
// bit, as the calls above on x widened to fp32 (which their rounding leaves as it is), on the
// same kernels. oneDNN and towerflow's own kernels read x as it is (their packing widens it where
// it would have rounded an fp32 x); the emulated path widens it into a scratch buffer.

// y[i] = x[i] as a float (exact).
void widen_bf16(std::int64_t n, const std::uint16_t* x, float* y);

void conv2d_forward_bf16_input(const CpuContext& ctx, const Conv2dShape& s,
                               const std::uint16_t* x, const float* w, const float* bias_or_null,
                               float* y);
void conv2d_backward_weight_bf16_input(const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* dy, float* dw);
bool conv2d_forward_bf16_input_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                    const std::uint16_t* x, const float* w,
                                    const float* bias_or_null, float* y);
bool conv2d_backward_weight_bf16_input_with(Bf16Kernels k, const CpuContext& ctx,
                                            const Conv2dShape& s, const std::uint16_t* x,
                                            const float* dy, float* dw);

// ---- bf16 outputs ---------------------------------------------------------------------------
// The forward with y stored as bf16 bits: the fp32 result rounded to nearest, ties to even, for a
// batch norm that alone reads it (Note [bf16 convolution outputs] in core/tensor/ops.cc), x as
// floats or as bf16 bits (above). oneDNN rounds its sums as it stores them, and towerflow's
// Winograd kernels theirs (vcvtneps2bf16 on the instruction's build, which flushes denormals to
// zero); the other kernels (the pair and AMX kernels' direct paths, the emulated path) write the
// fp32 result into a scratch buffer that is then rounded (narrow_to_bf16). So on each kernel,
// y is that kernel's fp32 y rounded, but for denormals, which may become zeros, and for oneDNN,
// whose kernel for a bf16 y may sum in another order than its kernel for an fp32 one.

// y[i] = the bits of round_to_bf16(x[i]) (its top half), for i < n.
void narrow_to_bf16(std::int64_t n, const float* x, std::uint16_t* y);

void conv2d_forward_bf16_output(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                const float* w, const float* bias_or_null, std::uint16_t* y);
void conv2d_forward_bf16_output(const CpuContext& ctx, const Conv2dShape& s, const std::uint16_t* x,
                                const float* w, const float* bias_or_null, std::uint16_t* y);
bool conv2d_forward_bf16_output_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const float* x, const float* w, const float* bias_or_null,
                                     std::uint16_t* y);
bool conv2d_forward_bf16_output_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                     const std::uint16_t* x, const float* w,
                                     const float* bias_or_null, std::uint16_t* y);
// The Winograd forward (conv2d_forward_bf16_winograd_with) with bf16 outputs.
bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const float* x, const float* w, const float* bias_or_null,
                                       std::uint16_t* y);
bool conv2d_forward_bf16_winograd_with(Bf16Kernels k, const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, std::uint16_t* y);

}  // namespace towerflow::cpu
