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
#include "core/cpu/isa.h"
#include "core/cpu/pool.h"

#ifndef TW_ISA
#define TW_ISA generic
#endif

namespace towerflow::cpu {

// Every kernel of the table, once: the table's fields, each build's declarations and its table
// (table.cc) come from this list, so they cannot disagree.
#define TW_CPU_KERNELS(X) \
  X(conv2d_forward) \
  X(conv2d_backward_input) \
  X(conv2d_backward_input_add) \
  X(conv2d_backward_weight) \
  X(conv2d_forward_winograd) \
  X(conv2d_backward_input_winograd) \
  X(conv2d_backward_input_add_winograd) \
  X(conv2d_backward_weight_winograd) \
  X(conv2d_forward_bias) \
  X(conv2d_backward_bias) \
  X(max_pool_forward) \
  X(max_pool_backward) \
  X(max_pool_backward_channel_sums) \
  X(max_pool_backward_rows) \
  X(max_pool_relu_forward) \
  X(max_pool_relu_forward_bf16) \
  X(avg_pool_forward) \
  X(avg_pool_backward) \
  X(batch_norm_forward_training) \
  X(batch_norm_forward_inference) \
  X(batch_norm_backward) \
  X(batch_norm_relu_forward_training) \
  X(batch_norm_relu_forward_training_bf16) \
  X(batch_norm_add_relu_forward_training) \
  X(batch_norm_relu_backward) \
  X(batch_norm_forward_training_bf16_input) \
  X(batch_norm_relu_forward_training_bf16_input) \
  X(batch_norm_relu_forward_training_bf16_io) \
  X(batch_norm_add_relu_forward_training_bf16_input) \
  X(batch_norm_backward_bf16_input) \
  X(batch_norm_relu_backward_bf16_input) \
  X(batch_norm_moments) \
  X(batch_norm_forward_apply) \
  X(batch_norm_backward_reduce) \
  X(batch_norm_backward_apply) \
  X(gemm) \
  X(add) \
  X(mul) \
  X(scale) \
  X(axpy) \
  X(relu_forward) \
  X(relu_backward) \
  X(gelu_forward) \
  X(gelu_backward) \
  X(bias_add) \
  X(sum_rows) \
  X(transpose)

struct KernelTable {
#define TW_KERNEL_FIELD(name) decltype(&cpu::name) name;
  TW_CPU_KERNELS(TW_KERNEL_FIELD)
#undef TW_KERNEL_FIELD
};

// The table of the instruction set isa.h chose (isa.cc).
const KernelTable& kernels();
// The table of `isa`, which must be built and supported on this CPU (InvalidArgument otherwise):
// the kernel choice's candidates of another instruction set (kernel_choice.cc).
const KernelTable& kernels_of(Isa isa);

}  // namespace towerflow::cpu
