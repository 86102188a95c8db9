#pragma once
// The CPU kernels of one instruction set, as a table of function pointers (private).
//
// conv.cc, pool.cc, batch_norm.cc, gemm.cc and elementwise.cc are compiled once per instruction set the build
// supports (core/cpu/CMakeLists.txt), each time with that set's -march and TW_ISA naming a
// namespace of its own (towerflow::cpu::avx2, ...); table.cc then defines that build's table as
// the C symbol towerflow_cpu_kernels_<isa>. Each build is partially linked into one object whose
// every other symbol is made local, so the builds share nothing, not even the inline functions
// and template instantiations (Eigen's, the standard library's) they compile differently. The
// public functions (conv.h, pool.h, batch_norm.h, gemm.h, elementwise.h) call the table isa.h chose.

#include "core/cpu/batch_norm.h"
#include "core/cpu/conv.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/gemm.h"
#include "core/cpu/pool.h"

#ifndef TW_ISA
#define TW_ISA generic
#endif

namespace towerflow::cpu {

struct KernelTable {
  decltype(&cpu::conv2d_forward) conv2d_forward;
  decltype(&cpu::conv2d_backward_input) conv2d_backward_input;
  decltype(&cpu::conv2d_backward_weight) conv2d_backward_weight;
  decltype(&cpu::conv2d_forward_bias) conv2d_forward_bias;
  decltype(&cpu::conv2d_backward_bias) conv2d_backward_bias;
  decltype(&cpu::max_pool_forward) max_pool_forward;
  decltype(&cpu::max_pool_backward) max_pool_backward;
  decltype(&cpu::avg_pool_forward) avg_pool_forward;
  decltype(&cpu::avg_pool_backward) avg_pool_backward;
  decltype(&cpu::batch_norm_forward_training) batch_norm_forward_training;
  decltype(&cpu::batch_norm_forward_inference) batch_norm_forward_inference;
  decltype(&cpu::batch_norm_backward) batch_norm_backward;
  decltype(&cpu::batch_norm_relu_forward_training) batch_norm_relu_forward_training;
  decltype(&cpu::batch_norm_add_relu_forward_training) batch_norm_add_relu_forward_training;
  decltype(&cpu::batch_norm_relu_backward) batch_norm_relu_backward;
  decltype(&cpu::batch_norm_moments) batch_norm_moments;
  decltype(&cpu::batch_norm_forward_apply) batch_norm_forward_apply;
  decltype(&cpu::batch_norm_backward_reduce) batch_norm_backward_reduce;
  decltype(&cpu::batch_norm_backward_apply) batch_norm_backward_apply;
  decltype(&cpu::gemm) gemm;
  decltype(&cpu::add) add;
  decltype(&cpu::mul) mul;
  decltype(&cpu::scale) scale;
  decltype(&cpu::axpy) axpy;
  decltype(&cpu::relu_forward) relu_forward;
  decltype(&cpu::relu_backward) relu_backward;
  decltype(&cpu::bias_add) bias_add;
};

// The table of the instruction set isa.h chose (isa.cc).
const KernelTable& kernels();

}  // namespace towerflow::cpu
