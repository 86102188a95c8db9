#pragma once
// The bf16 kernels of bf16.h built on vdpbf16ps, the AVX512-BF16 product of bf16 pairs (private
// to core/cpu; Note [bf16 pair kernels] in bf16_pairs.cc). bf16_pairs.cc is compiled twice, into
// objects of their own as the kernel tables of kernel_table.h are: with the instruction
// (towerflow_bf16_pairs_avx512bf16), and for AVX-512F alone with the instruction emulated
// (towerflow_bf16_pairs_avx512bf16_emulated). The build defines TW_HAVE_BF16_PAIRS where it
// compiles them (x86-64 with a compiler that knows -mavx512bf16).
//
// Contract: bf16.h's, for the kernels it names; callers have checked the CPU (AVX512-BF16 for
// the first table, AVX-512F, BW, DQ and VL for both).

#include "core/cpu/bf16.h"

namespace towerflow::cpu {

// The table each object of bf16 kernels exports (bf16_pairs.cc here, bf16_amx.cc in bf16_amx.h).
struct Bf16KernelTable {
  decltype(&conv2d_forward_bf16) conv2d_forward;
  decltype(&conv2d_backward_input_bf16) conv2d_backward_input;
  decltype(&conv2d_backward_weight_bf16) conv2d_backward_weight;
  decltype(&gemm_bf16) gemm;
  // bf16.h's bf16 inputs, read as they are.
  decltype(&conv2d_forward_bf16_input) forward_bf16_input;
  decltype(&conv2d_backward_weight_bf16_input) backward_weight_bf16_input;
  // The weight gradient by Winograd's F(2x2, 3x3) (Note [bf16 Winograd weight gradient] in
  // bf16_pairs.cc), x as floats or bf16 bits: false, with nothing written, where the object has
  // none for the problem (3x3 stride-1 kernels with channels in multiples of 8 only; none on AMX).
  bool (*winograd_backward_weight)(const CpuContext&, const Conv2dShape&, const float* x,
                                   const float* dy, float* dw);
  bool (*winograd_backward_weight_bf16_input)(const CpuContext&, const Conv2dShape&,
                                              const std::uint16_t* x, const float* dy, float* dw);
  // The forward and the stride-1 backward input by the same (Note [bf16 Winograd convolution]).
  bool (*winograd_forward)(const CpuContext&, const Conv2dShape&, const float* x, const float* w,
                           const float* bias_or_null, float* y);
  bool (*winograd_forward_bf16_input)(const CpuContext&, const Conv2dShape&, const std::uint16_t* x,
                                      const float* w, const float* bias_or_null, float* y);
  // The forward with y stored as bf16 bits (bf16.h's bf16 outputs), x as floats or bf16 bits.
  bool (*winograd_forward_bf16_output)(const CpuContext&, const Conv2dShape&, const float* x,
                                       const float* w, const float* bias_or_null, std::uint16_t* y);
  bool (*winograd_forward_bf16_io)(const CpuContext&, const Conv2dShape&, const std::uint16_t* x,
                                   const float* w, const float* bias_or_null, std::uint16_t* y);
  bool (*winograd_backward_input)(const CpuContext&, const Conv2dShape&, const float* dy,
                                  const float* w, float* dx);
  // The weight gradient with dy read through rows (bf16.h's DyRows): false, with nothing written,
  // where the object has no such path for the problem.
  bool (*backward_weight_dy_rows)(const CpuContext&, const Conv2dShape&, const float* x,
                                  const DyRows& rows, float* dw);
  // dx += conv2d_backward_input's dx, added as the kernels store it (one rounding: the bits of
  // the result added afterwards), directly or by Winograd (stride 1): false, with nothing written,
  // where the object has no such path for the problem (no Winograd on AMX).
  bool (*backward_input_add)(const CpuContext&, const Conv2dShape&, const float* dy, const float* w,
                             float* dx);
  bool (*winograd_backward_input_add)(const CpuContext&, const Conv2dShape&, const float* dy,
                                      const float* w, float* dx);
};

}  // namespace towerflow::cpu

#if defined(TW_HAVE_BF16_PAIRS)
extern "C" const towerflow::cpu::Bf16KernelTable towerflow_bf16_pairs_avx512bf16;
extern "C" const towerflow::cpu::Bf16KernelTable towerflow_bf16_pairs_avx512bf16_emulated;
#endif
