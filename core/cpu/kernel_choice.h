#pragma once
// The CPU's convolutions and matrix products through the kernel choice of core/kernel_choice.h
// (private to core): the CPU backend calls these; each runs the problem on the fixed kernels or
// on the measured fastest. Arguments, layouts and overwrite rules are conv.h's and gemm.h's.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cpu/bf16.h"
#include "core/cpu/context.h"
#include "core/cpu/isa.h"
#include "core/shapes.h"

namespace towerflow::cpu {

// `bf16`: operands read as bf16 (bf16.h) rather than fp32. `layer` names the call's op scope for
// the record of a new choice.
void conv2d_forward_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                           const float* w, const float* bias_or_null, float* y, bool bf16,
                           std::string_view layer);
void conv2d_backward_input_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                  const float* w, float* dx, bool bf16, std::string_view layer);
// dx += the fp32 backward input, as a problem of its own ("backward input, added"), whose
// candidates are towerflow's direct and Winograd kernels adding as they store (conv.h's
// conv2d_backward_input_add and its Winograd twin) and oneDNN's backward input followed by an
// add. False, dx untouched, where the problem is settled on oneDNN: the caller then computes the
// gradient with conv2d_backward_input_chosen and adds it. While the problem is measured, dx is
// restored before each candidate runs, and the call adds once.
bool conv2d_backward_input_add_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* dy,
                                      const float* w, float* dx, std::string_view layer);
// dx += the bf16 backward input, as a problem of its own ("backward input, added"), whose
// candidates are towerflow's kernels adding as they store (bf16.h's
// conv2d_backward_input_bf16_add_with and its Winograd twin) and oneDNN's backward input followed
// by an add. In fixed mode, the fixed kernels' add (conv2d_backward_input_bf16_add_with). False,
// dx untouched, where the problem is settled on oneDNN, or in fixed mode where the fixed kernels
// are oneDNN's: the caller then computes the gradient with
// conv2d_backward_input_chosen and adds it. While the problem is measured, dx is restored before
// each candidate runs, and the call adds once.
bool conv2d_backward_input_bf16_add_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                           const float* dy, const float* w, float* dx,
                                           std::string_view layer);
void conv2d_backward_weight_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                   const float* dy, float* dw, bool bf16, std::string_view layer);
// The bf16 weight gradient with dy read through rows (bf16.h's DyRows) where the problem's choice
// (conv2d_backward_weight_chosen's, bf16) is settled on kernels that have such a path, towerflow's
// pair kernels; false, having written nothing and called rows never, elsewhere: on other kernels,
// or where the choice is still to be measured (the caller then stores dy and calls
// conv2d_backward_weight_chosen, which measures).
bool conv2d_backward_weight_bf16_dy_rows_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                                const float* x, const DyRows& rows, float* dw);
// The bf16 forward and weight gradient with x stored as bf16 bits (bf16.h's bf16 inputs): problems
// of their own ("..., bf16 input"), since reading half the bytes of x may change which kernels
// are fastest.
void conv2d_forward_bf16_input_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                      const std::uint16_t* x, const float* w,
                                      const float* bias_or_null, float* y, std::string_view layer);
void conv2d_backward_weight_bf16_input_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                              const std::uint16_t* x, const float* dy, float* dw,
                                              std::string_view layer);
// The bf16 forward with y stored as bf16 bits (bf16.h's bf16 outputs), x as floats or bf16 bits:
// problems of their own ("..., bf16 output"), since writing half the bytes of y, and rounding
// it, may change which kernels are fastest.
void conv2d_forward_bf16_output_chosen(const CpuContext& ctx, const Conv2dShape& s, const float* x,
                                       const float* w, const float* bias_or_null, std::uint16_t* y,
                                       std::string_view layer);
void conv2d_forward_bf16_output_chosen(const CpuContext& ctx, const Conv2dShape& s,
                                       const std::uint16_t* x, const float* w,
                                       const float* bias_or_null, std::uint16_t* y,
                                       std::string_view layer);
// c = op(a) op(b) (alpha 1, beta 0).
void gemm_chosen(const CpuContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                 const float* a, int lda, const float* b, int ldb, float* c, int ldc, bool bf16,
                 std::string_view layer);

// The mechanism under the four above, for them and for tests.
struct ChoiceProblem {
  std::string key;       // the problem, unique with the operands and threads: the cache's key
  std::string pass;      // KernelChoiceRecord::pass
  std::string problem;   // KernelChoiceRecord::problem
  bool bf16 = false;
  int threads = 1;
};
// run(name) runs the problem on candidate `name` and returns false where that candidate declines
// it (having written nothing). candidates[0] is the fixed choice, which must not decline; in auto
// mode a candidate other than it must be at least kChoiceMargin faster to be chosen, so that
// measuring noise does not flip a choice between runs.
inline constexpr double kChoiceMargin = 0.05;
// The choice among measured times (candidate, time; at least one): the fastest, unless `fixed` is
// among them and the fastest beats it by less than kChoiceMargin.
std::string choose_fastest(const std::vector<std::pair<std::string, double>>& times,
                           const std::string& fixed);
// before_each (optional) runs before every run of a problem being measured, untimed: for runs
// that add to their output, which it restores.
void run_chosen(const ChoiceProblem& p, std::string_view layer,
                const std::vector<std::string>& candidates,
                const std::function<bool(const std::string&)>& run,
                const std::function<void()>& before_each = {});

// The candidate run_chosen runs for p without measuring anything: the fixed one (fixed mode, a
// single candidate), the forced one, or the one this process has chosen for p; nullopt where
// run_chosen would still read the cache or measure.
std::optional<std::string> settled_choice(const ChoiceProblem& p,
                                          const std::vector<std::string>& candidates);

// Tests: make the fp32 candidates of these instruction sets' kernels ("towerflow-baseline",
// "winograd-baseline", ...) candidates beside the active set's, in place of the rule of Note
// [Other instruction sets as candidates] (kernel_choice.cc); nullopt for the rule. Each must be
// built and supported here. Not thread-safe with running kernels.
void isa_candidates_for_testing(std::optional<std::vector<Isa>> isas);

// Tests: in auto mode, run every problem on the candidate `name` where it is one (and where it
// declines, on the fixed choice) without measuring or recording; nullopt to measure again.
void force_kernel_candidate_for_testing(std::optional<std::string> name);

}  // namespace towerflow::cpu
