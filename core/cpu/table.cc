// This instruction set's kernel table (kernel_table.h), compiled with the kernels.
#include "core/cpu/kernel_table.h"

#define TW_CAT_(a, b) a##b
#define TW_CAT(a, b) TW_CAT_(a, b)

namespace towerflow::cpu::TW_ISA {
// The kernels, defined in this namespace by conv.cc, pool.cc, batch_norm.cc, gemm.cc and elementwise.cc.
decltype(cpu::conv2d_forward) conv2d_forward;
decltype(cpu::conv2d_backward_input) conv2d_backward_input;
decltype(cpu::conv2d_backward_weight) conv2d_backward_weight;
decltype(cpu::conv2d_forward_bias) conv2d_forward_bias;
decltype(cpu::conv2d_backward_bias) conv2d_backward_bias;
decltype(cpu::max_pool_forward) max_pool_forward;
decltype(cpu::max_pool_backward) max_pool_backward;
decltype(cpu::avg_pool_forward) avg_pool_forward;
decltype(cpu::avg_pool_backward) avg_pool_backward;
decltype(cpu::batch_norm_forward_training) batch_norm_forward_training;
decltype(cpu::batch_norm_forward_inference) batch_norm_forward_inference;
decltype(cpu::batch_norm_backward) batch_norm_backward;
decltype(cpu::batch_norm_relu_forward_training) batch_norm_relu_forward_training;
decltype(cpu::batch_norm_add_relu_forward_training) batch_norm_add_relu_forward_training;
decltype(cpu::batch_norm_relu_backward) batch_norm_relu_backward;
decltype(cpu::batch_norm_moments) batch_norm_moments;
decltype(cpu::batch_norm_forward_apply) batch_norm_forward_apply;
decltype(cpu::batch_norm_backward_reduce) batch_norm_backward_reduce;
decltype(cpu::batch_norm_backward_apply) batch_norm_backward_apply;
decltype(cpu::gemm) gemm;
decltype(cpu::add) add;
decltype(cpu::mul) mul;
decltype(cpu::scale) scale;
decltype(cpu::axpy) axpy;
decltype(cpu::relu_forward) relu_forward;
decltype(cpu::relu_backward) relu_backward;
decltype(cpu::bias_add) bias_add;
}  // namespace towerflow::cpu::TW_ISA

extern "C" const towerflow::cpu::KernelTable TW_CAT(towerflow_cpu_kernels_, TW_ISA) = {
    &towerflow::cpu::TW_ISA::conv2d_forward,
    &towerflow::cpu::TW_ISA::conv2d_backward_input,
    &towerflow::cpu::TW_ISA::conv2d_backward_weight,
    &towerflow::cpu::TW_ISA::conv2d_forward_bias,
    &towerflow::cpu::TW_ISA::conv2d_backward_bias,
    &towerflow::cpu::TW_ISA::max_pool_forward,
    &towerflow::cpu::TW_ISA::max_pool_backward,
    &towerflow::cpu::TW_ISA::avg_pool_forward,
    &towerflow::cpu::TW_ISA::avg_pool_backward,
    &towerflow::cpu::TW_ISA::batch_norm_forward_training,
    &towerflow::cpu::TW_ISA::batch_norm_forward_inference,
    &towerflow::cpu::TW_ISA::batch_norm_backward,
    &towerflow::cpu::TW_ISA::batch_norm_relu_forward_training,
    &towerflow::cpu::TW_ISA::batch_norm_add_relu_forward_training,
    &towerflow::cpu::TW_ISA::batch_norm_relu_backward,
    &towerflow::cpu::TW_ISA::batch_norm_moments,
    &towerflow::cpu::TW_ISA::batch_norm_forward_apply,
    &towerflow::cpu::TW_ISA::batch_norm_backward_reduce,
    &towerflow::cpu::TW_ISA::batch_norm_backward_apply,
    &towerflow::cpu::TW_ISA::gemm,
    &towerflow::cpu::TW_ISA::add,
    &towerflow::cpu::TW_ISA::mul,
    &towerflow::cpu::TW_ISA::scale,
    &towerflow::cpu::TW_ISA::axpy,
    &towerflow::cpu::TW_ISA::relu_forward,
    &towerflow::cpu::TW_ISA::relu_backward,
    &towerflow::cpu::TW_ISA::bias_add,
};
