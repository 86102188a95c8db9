// The [cuda] parity suite: every GPU kernel against its CPU twin (core/cpu kernels, the CPU
// backend of the tensor ops, or a double-precision reference where no CPU kernel exists) on
// identical random inputs, forward and backward, with a tolerance per op and the max error
// printed for each.
//
// Without a usable GPU (a build without CUDA, no driver, no device) the executable prints
// "SKIPPED: no CUDA device (<reason>)" and exits 77, which CTest reports as Skipped.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/batch_norm.h"
#include "core/cpu/context.h"
#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/pool.h"
#include "core/cuda/context.h"
#include "core/cuda/copy.h"
#include "core/cuda/ops.h"
#include "core/cuda/optimizer_kernels.h"
#include "core/cuda/status.h"
#include "core/memory/memory.h"
#include "core/platform/registry.h"
#include "core/tensor/backend_impl.h"
#include "core/tensor/cpu_backend.h"
#include "core/tensor/ops.h"
#include "core/tensor/precision.h"
#include "core/tensor/tensor.h"
#include "models/models.h"

namespace tw = towerflow;
namespace gpu = towerflow::gpu;
namespace cpu = towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;

namespace {

// ---- fixtures ----------------------------------------------------------------------------------

struct Gpu {
  std::unique_ptr<tw::Allocator> allocator;
  std::unique_ptr<gpu::GpuContext> ctx;
  Gpu() {
    allocator = tw::make_bfc_allocator(tw::make_cuda_sub_allocator(0),
                                       tw::BfcOptions{.device_name = "/gpu:0",
                                                      .limit_bytes = std::size_t{2} << 30});
    ctx = std::make_unique<gpu::GpuContext>(gpu::GpuContextOptions{
        .device = tw::Device::gpu(0), .ordinal = 0, .allocator = allocator.get()});
  }
};

Gpu& the_gpu() {
  static Gpu g;
  return g;
}
const cpu::CpuContext& the_cpu() {
  static cpu::CpuContext c(2);
  return c;
}
tw::Backend& cpu_backend() {
  static auto allocator = tw::make_bfc_allocator(
      tw::make_host_sub_allocator(),
      tw::BfcOptions{.device_name = "/cpu:0", .limit_bytes = std::size_t{1} << 30});
  static auto backend = tw::make_cpu_backend(tw::Device::cpu(0), *allocator, 2);
  return *backend;
}

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

template <typename T>
gpu::DeviceBuffer upload(const std::vector<T>& v) {
  gpu::DeviceBuffer b(*the_gpu().ctx, std::max<std::size_t>(v.size(), 1) * sizeof(T));
  gpu::copy_to_device(*the_gpu().ctx, b.data(), v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T = float>
gpu::DeviceBuffer device_zeros(std::size_t n) {
  gpu::DeviceBuffer b(*the_gpu().ctx, std::max<std::size_t>(n, 1) * sizeof(T));
  gpu::memset_device(*the_gpu().ctx, b.data(), 0, n * sizeof(T));
  return b;
}
template <typename T = float>
std::vector<T> download(const gpu::DeviceBuffer& b, std::size_t n) {
  std::vector<T> v(n);
  gpu::copy_to_host(*the_gpu().ctx, v.data(), b.data(), n * sizeof(T));
  the_gpu().ctx->synchronize();
  return v;
}

// Checks |gpu - ref| <= atol + rtol * |ref| elementwise and prints the max error for the op.
void expect_close(const char* op, const std::vector<float>& got, const std::vector<float>& ref,
                  double atol, double rtol) {
  REQUIRE(got.size() == ref.size());
  double max_err = 0.0, max_ref = 0.0;
  std::size_t worst = 0, bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const bool nan_mismatch = std::isnan(got[i]) != std::isnan(ref[i]);
    if (nan_mismatch || e > atol + rtol * std::fabs(static_cast<double>(ref[i]))) ++bad;
    if (e > max_err || nan_mismatch) {
      max_err = nan_mismatch ? INFINITY : e;
      worst = i;
    }
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  std::printf("[cuda] %-36s n=%-8zu max abs err %.3e (atol %.1e, rtol %.1e, max |ref| %.3g)\n",
              op, ref.size(), max_err, atol, rtol, max_ref);
  INFO(op << ": " << bad << " of " << ref.size() << " elements out of tolerance; worst at " << worst
          << ": gpu " << (ref.empty() ? 0.0f : got[worst]) << " vs cpu "
          << (ref.empty() ? 0.0f : ref[worst]));
  CHECK(bad == 0);
}

// ---- convolution -------------------------------------------------------------------------------

void conv_parity(const Conv2dShape& s, std::uint32_t seed) {
  auto& ctx = *the_gpu().ctx;
  const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c_in;
  const std::size_t ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  const std::size_t nw = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
  const auto x = random_vector(nx, seed), w = random_vector(nw, seed + 1),
             dy = random_vector(ny, seed + 2), bias = random_vector(s.c_out, seed + 3);
  auto gx = upload(x), gw = upload(w), gdy = upload(dy), gb = upload(bias);
  auto gy = device_zeros(ny), gdx = device_zeros(nx), gdw = device_zeros(nw),
       gdb = device_zeros(s.c_out);
  std::vector<float> y(ny), dx(nx), dw(nw), db(s.c_out);
  INFO(s.to_string());

  gpu::conv2d_forward_bias(ctx, s, gx.as<float>(), gw.as<float>(), gb.as<float>(), gy.as<float>());
  cpu::conv2d_forward_bias(the_cpu(), s, x.data(), w.data(), bias.data(), y.data());
  const double terms = double(s.c_in) * s.kh * s.kw;
  expect_close("conv2d_forward_bias", download(gy, ny), y, 2e-6 * terms, 1e-5);

  gpu::conv2d_backward_input(ctx, s, gdy.as<float>(), gw.as<float>(), gdx.as<float>());
  cpu::conv2d_backward_input(the_cpu(), s, dy.data(), w.data(), dx.data());
  expect_close("conv2d_backward_input", download(gdx, nx), dx, 2e-6 * double(s.c_out) * s.kh * s.kw,
               1e-5);

  gpu::conv2d_backward_weight(ctx, s, gx.as<float>(), gdy.as<float>(), gdw.as<float>());
  cpu::conv2d_backward_weight(the_cpu(), s, x.data(), dy.data(), dw.data());
  expect_close("conv2d_backward_weight", download(gdw, nw), dw,
               2e-6 * double(s.n) * s.out_h() * s.out_w(), 1e-5);

  gpu::conv2d_backward_bias(ctx, s, gdy.as<float>(), gdb.as<float>());
  cpu::conv2d_backward_bias(the_cpu(), s, dy.data(), db.data());
  expect_close("conv2d_backward_bias", download(gdb, s.c_out), db,
               1e-6 * double(s.n) * s.out_h() * s.out_w(), 1e-5);
}

}  // namespace

TEST_CASE("conv2d forward and backward match the CPU kernels", "[cuda]") {
  conv_parity({.n = 4, .h = 9, .w = 7, .c_in = 5, .c_out = 6, .kh = 3, .kw = 3, .stride_h = 1,
               .stride_w = 1, .pad_h = 1, .pad_w = 1},
              11);
  conv_parity({.n = 3, .h = 8, .w = 8, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2,
               .stride_w = 2, .pad_h = 1, .pad_w = 1},
              12);
  conv_parity({.n = 2, .h = 8, .w = 8, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2,
               .stride_w = 2},
              13);
  conv_parity({.n = 2, .h = 11, .w = 6, .c_in = 3, .c_out = 4, .kh = 5, .kw = 3, .stride_h = 1,
               .stride_w = 2, .pad_h = 2, .pad_w = 0},
              14);
  // The same shape again comes from the context's plan cache and must give the same result.
  conv_parity({.n = 4, .h = 9, .w = 7, .c_in = 5, .c_out = 6, .kh = 3, .kw = 3, .stride_h = 1,
               .stride_w = 1, .pad_h = 1, .pad_w = 1},
              15);
}

TEST_CASE("max and average pooling match the CPU kernels", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  for (const Pool2dShape s :
       {Pool2dShape{.n = 3, .h = 9, .w = 8, .c = 5, .kh = 3, .kw = 3, .stride_h = 2,
                         .stride_w = 2, .pad_h = 1, .pad_w = 1},
        Pool2dShape{.n = 2, .h = 8, .w = 8, .c = 4, .kh = 2, .kw = 2, .stride_h = 2,
                         .stride_w = 2},
        Pool2dShape{.n = 2, .h = 7, .w = 5, .c = 3, .kh = 3, .kw = 2, .stride_h = 1,
                         .stride_w = 1, .pad_h = 1, .pad_w = 1}}) {
    INFO(s.to_string());
    const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c;
    const std::size_t ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c;
    auto x = random_vector(nx, 21);
    // Repeated values make ties, which must resolve as on the CPU; so must two NaNs in one window
    // (neighbouring pixels, the same channel): the last one's index.
    for (std::size_t i = 0; i < nx; i += 7) x[i] = 0.5f;
    x[5 % s.c] = x[5 % s.c + s.c] = NAN;
    const auto dy = random_vector(ny, 22);
    auto gx = upload(x), gdy = upload(dy);
    auto gy = device_zeros(ny), gdx = device_zeros(nx);
    auto garg = device_zeros<std::int32_t>(ny);
    std::vector<float> y(ny), dx(nx);
    std::vector<std::int32_t> arg(ny);

    gpu::max_pool_forward(ctx, s, gx.as<float>(), gy.as<float>(), garg.as<std::int32_t>());
    cpu::max_pool_forward(the_cpu(), s, x.data(), y.data(), arg.data());
    expect_close("max_pool_forward", download(gy, ny), y, 0.0, 0.0);
    CHECK(download<std::int32_t>(garg, ny) == arg);
    gpu::max_pool_backward(ctx, s, gdy.as<float>(), garg.as<std::int32_t>(), gdx.as<float>());
    cpu::max_pool_backward(the_cpu(), s, dy.data(), arg.data(), dx.data());
    expect_close("max_pool_backward", download(gdx, nx), dx, 1e-6, 1e-6);
    // The fused ReLU: the pooled outputs below zero (about half) pass no gradient.
    gpu::max_pool_relu_forward(ctx, s, gx.as<float>(), gy.as<float>(), garg.as<std::int32_t>());
    cpu::max_pool_relu_forward(the_cpu(), s, x.data(), y.data(), arg.data());
    expect_close("max_pool_relu_forward", download(gy, ny), y, 0.0, 0.0);
    CHECK(download<std::int32_t>(garg, ny) == arg);
    gpu::max_pool_backward(ctx, s, gdy.as<float>(), garg.as<std::int32_t>(), gdx.as<float>());
    cpu::max_pool_backward(the_cpu(), s, dy.data(), arg.data(), dx.data());
    expect_close("max_pool_backward after the ReLU", download(gdx, nx), dx, 1e-6, 1e-6);

    gpu::avg_pool_forward(ctx, s, gx.as<float>(), gy.as<float>());
    cpu::avg_pool_forward(the_cpu(), s, x.data(), y.data());
    expect_close("avg_pool_forward", download(gy, ny), y, 1e-6, 1e-5);
    gpu::avg_pool_backward(ctx, s, gdy.as<float>(), gdx.as<float>());
    cpu::avg_pool_backward(the_cpu(), s, dy.data(), dx.data());
    expect_close("avg_pool_backward", download(gdx, nx), dx, 1e-6, 1e-5);
  }
}

TEST_CASE("batch norm training, inference, fused variants and backward match the CPU",
          "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  const std::int64_t rows = 2 * 6 * 5;
  const int c = 7;
  const float eps = 1e-5f;
  const std::size_t n = std::size_t(rows) * c;
  auto x = random_vector(n, 31, -2.0f, 3.0f);
  const auto res = random_vector(n, 32), dy = random_vector(n, 33),
             gamma = random_vector(c, 34, 0.5f, 1.5f), beta = random_vector(c, 35),
             rmean = random_vector(c, 36), rvar = random_vector(c, 37, 0.5f, 2.0f);
  auto gx = upload(x), gres = upload(res), gdy = upload(dy), ggamma = upload(gamma),
       gbeta = upload(beta), grmean = upload(rmean), grvar = upload(rvar);
  auto gy = device_zeros(n), gdx = device_zeros(n), gmean = device_zeros(c),
       ginv = device_zeros(c), gdg = device_zeros(c), gdb = device_zeros(c), gpre = device_zeros(n);
  std::vector<float> y(n), dx(n), mean(c), inv(c), dg(c), db(c), pre(n);

  gpu::batch_norm_forward_training(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                   gbeta.as<float>(), eps, gy.as<float>(), gmean.as<float>(),
                                   ginv.as<float>());
  cpu::batch_norm_forward_training(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(), eps,
                                   y.data(), mean.data(), inv.data());
  expect_close("batch_norm_forward_training y", download(gy, n), y, 1e-5, 1e-5);
  expect_close("batch_norm_forward_training mean", download(gmean, c), mean, 1e-6, 1e-5);
  expect_close("batch_norm_forward_training invstd", download(ginv, c), inv, 1e-6, 1e-4);

  gpu::batch_norm_backward(ctx, rows, c, gx.as<float>(), gdy.as<float>(), ggamma.as<float>(),
                           gmean.as<float>(), ginv.as<float>(), eps, gdx.as<float>(),
                           gdg.as<float>(), gdb.as<float>());
  cpu::batch_norm_backward(the_cpu(), rows, c, x.data(), dy.data(), gamma.data(), mean.data(),
                           inv.data(), dx.data(), dg.data(), db.data());
  expect_close("batch_norm_backward dx", download(gdx, n), dx, 1e-5, 1e-4);
  expect_close("batch_norm_backward dgamma", download(gdg, c), dg, 1e-5, 1e-4);
  expect_close("batch_norm_backward dbeta", download(gdb, c), db, 1e-5, 1e-5);

  gpu::batch_norm_add_relu_forward_training(ctx, rows, c, gx.as<float>(), gres.as<float>(),
                                            ggamma.as<float>(), gbeta.as<float>(), eps,
                                            gy.as<float>(), gmean.as<float>(), ginv.as<float>());
  cpu::batch_norm_add_relu_forward_training(the_cpu(), rows, c, x.data(), res.data(),
                                            gamma.data(), beta.data(), eps, y.data(), mean.data(),
                                            inv.data());
  expect_close("batch_norm_add_relu_forward y", download(gy, n), y, 1e-5, 1e-5);
  gpu::batch_norm_relu_backward(ctx, rows, c, gx.as<float>(), gy.as<float>(), gdy.as<float>(),
                                ggamma.as<float>(), gmean.as<float>(), ginv.as<float>(), eps,
                                gdx.as<float>(), gdg.as<float>(), gdb.as<float>(),
                                gpre.as<float>());
  cpu::batch_norm_relu_backward(the_cpu(), rows, c, x.data(), y.data(), dy.data(), gamma.data(),
                                nullptr, mean.data(), inv.data(), dx.data(), dg.data(), db.data(),
                                pre.data());
  expect_close("batch_norm_relu_backward dx", download(gdx, n), dx, 1e-5, 1e-4);
  expect_close("batch_norm_relu_backward dgamma", download(gdg, c), dg, 1e-5, 1e-4);
  expect_close("batch_norm_relu_backward d_pre_relu", download(gpre, n), pre, 0.0, 0.0);

  gpu::batch_norm_relu_forward_training(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                        gbeta.as<float>(), eps, gy.as<float>(), gmean.as<float>(),
                                        ginv.as<float>());
  cpu::batch_norm_relu_forward_training(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(),
                                        eps, y.data(), mean.data(), inv.data());
  expect_close("batch_norm_relu_forward y", download(gy, n), y, 1e-5, 1e-5);

  gpu::batch_norm_forward_inference(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                    gbeta.as<float>(), grmean.as<float>(), grvar.as<float>(), eps,
                                    gy.as<float>());
  cpu::batch_norm_forward_inference(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(),
                                    rmean.data(), rvar.data(), eps, y.data());
  expect_close("batch_norm_forward_inference", download(gy, n), y, 1e-5, 1e-5);

  // Running statistics: PyTorch's rule with the unbiased variance, against a double reference.
  const float momentum = 0.1f;
  gpu::batch_norm_forward_training_ex(ctx, rows, c, gx.as<float>(), nullptr, false,
                                      ggamma.as<float>(), gbeta.as<float>(), eps, momentum,
                                      grmean.as<float>(), grvar.as<float>(), gy.as<float>(),
                                      gmean.as<float>(), ginv.as<float>());
  std::vector<float> want_mean(c), want_var(c);
  for (int j = 0; j < c; ++j) {
    double s = 0, ss = 0;
    for (std::int64_t r = 0; r < rows; ++r) s += x[r * c + j];
    const double mu = s / rows;
    for (std::int64_t r = 0; r < rows; ++r) ss += (x[r * c + j] - mu) * (x[r * c + j] - mu);
    want_mean[j] = float((1 - momentum) * rmean[j] + momentum * mu);
    want_var[j] = float((1 - momentum) * rvar[j] + momentum * ss / (rows - 1));
  }
  expect_close("batch_norm running_mean", download(grmean, c), want_mean, 1e-6, 1e-5);
  expect_close("batch_norm running_var", download(grvar, c), want_var, 1e-6, 1e-5);

  // cuDNN 8 and 9 accept any eps >= 0 (CUDNN_BN_MIN_EPSILON is 0): a small eps runs and matches
  // the CPU, a negative one is refused on the host, naming it, as the CPU kernel refuses it.
  {
    const float small = 1e-7f;
    gpu::batch_norm_forward_training(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                     gbeta.as<float>(), small, gy.as<float>(), gmean.as<float>(),
                                     ginv.as<float>());
    cpu::batch_norm_forward_training(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(),
                                     small, y.data(), mean.data(), inv.data());
    expect_close("batch_norm eps 1e-7 y", download(gy, rows * c), y, 1e-5, 1e-4);
  }
  REQUIRE_THROWS_AS(gpu::batch_norm_forward_training(ctx, rows, c, gx.as<float>(),
                                                     ggamma.as<float>(), gbeta.as<float>(), -1e-5f,
                                                     gy.as<float>(), gmean.as<float>(),
                                                     ginv.as<float>()),
                    tw::InvalidArgument);
}

// cuDNN refuses a batch dimension above 65535 (inference) or about 131070 (training); these row
// counts are beyond both, as evaluating ResNet-20 on 128 images of 32x32 (131072 rows) is. See
// Note [Batch norm shapes within cuDNN's limits] in core/cuda/batch_norm.cc.
TEST_CASE("batch norm beyond cuDNN's batch limit matches the CPU (70,000 and 1,000,000 rows)",
          "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  for (const std::int64_t rows : {std::int64_t{70000}, std::int64_t{131072},
                                  std::int64_t{1000000}, std::int64_t{1000003}}) {
    const int c = 16;
    const float eps = 1e-5f;
    const std::size_t n = std::size_t(rows) * c;
    INFO("rows " << rows);
    const auto x = random_vector(n, 41, -2.0f, 3.0f), dy = random_vector(n, 42),
               gamma = random_vector(c, 43, 0.5f, 1.5f), beta = random_vector(c, 44),
               rmean = random_vector(c, 45), rvar = random_vector(c, 46, 0.5f, 2.0f);
    auto gx = upload(x), gdy = upload(dy), ggamma = upload(gamma), gbeta = upload(beta),
         grmean = upload(rmean), grvar = upload(rvar);
    auto gy = device_zeros(n), gdx = device_zeros(n), gmean = device_zeros(c),
         ginv = device_zeros(c), gdg = device_zeros(c), gdb = device_zeros(c);
    std::vector<float> y(n), dx(n), mean(c), inv(c), dg(c), db(c);
    gpu::batch_norm_forward_training(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                     gbeta.as<float>(), eps, gy.as<float>(), gmean.as<float>(),
                                     ginv.as<float>());
    cpu::batch_norm_forward_training(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(),
                                     eps, y.data(), mean.data(), inv.data());
    expect_close("batch_norm large y", download(gy, n), y, 1e-4, 1e-4);
    expect_close("batch_norm large mean", download(gmean, c), mean, 1e-5, 1e-4);
    expect_close("batch_norm large invstd", download(ginv, c), inv, 1e-5, 1e-4);
    gpu::batch_norm_backward(ctx, rows, c, gx.as<float>(), gdy.as<float>(), ggamma.as<float>(),
                             gmean.as<float>(), ginv.as<float>(), eps, gdx.as<float>(),
                             gdg.as<float>(), gdb.as<float>());
    cpu::batch_norm_backward(the_cpu(), rows, c, x.data(), dy.data(), gamma.data(), mean.data(),
                             inv.data(), dx.data(), dg.data(), db.data());
    expect_close("batch_norm large dx", download(gdx, n), dx, 1e-4, 1e-3);
    expect_close("batch_norm large dgamma", download(gdg, c), dg, 1e-2, 1e-3);
    expect_close("batch_norm large dbeta", download(gdb, c), db, 1e-2, 1e-3);
    gpu::batch_norm_forward_inference(ctx, rows, c, gx.as<float>(), ggamma.as<float>(),
                                      gbeta.as<float>(), grmean.as<float>(), grvar.as<float>(),
                                      eps, gy.as<float>());
    cpu::batch_norm_forward_inference(the_cpu(), rows, c, x.data(), gamma.data(), beta.data(),
                                      rmean.data(), rvar.data(), eps, y.data());
    expect_close("batch_norm large inference", download(gy, n), y, 1e-5, 1e-5);
  }
}

TEST_CASE("batch norm backward through the backends, with the forward's eps, matches the CPU on "
          "a constant channel (variance 0)", "[cuda]") {
  // Note [Batch-norm backward eps]: with variance 0, 1/sqrt(var + eps) is finite only with the
  // forward's eps; the GPU's backward gets that eps and must give the CPU backend's gradients.
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  tw::Backend& gb = tw::backend_for(tw::Device::gpu(0));
  tw::Backend& cb = cpu_backend();
  const std::int64_t rows = 4 * 3 * 3;
  const int c = 3;
  const float eps = 1e-3f;
  const std::size_t n = std::size_t(rows) * c;
  std::vector<float> x = random_vector(n, 51, -2.0f, 3.0f);
  for (std::int64_t r = 0; r < rows; ++r) x[r * c + 1] = 0.75f;  // channel 1 is constant
  const auto dy = random_vector(n, 52), gamma = random_vector(c, 53, 0.5f, 1.5f),
             beta = random_vector(c, 54);
  struct Run {
    std::vector<float> y, mean, invstd, dx, dgamma, dbeta;
  };
  auto run = [&](tw::Backend& be, bool relu) {
    tw::Allocator& a = be.allocator();
    auto buffer = [&](std::size_t count, const float* from) {
      float* p = static_cast<float*>(a.allocate(count * sizeof(float)));
      if (from != nullptr) be.copy_from_host(p, from, count * sizeof(float));
      return p;
    };
    float *bx = buffer(n, x.data()), *bdy = buffer(n, dy.data()),
          *bgamma = buffer(c, gamma.data()), *bbeta = buffer(c, beta.data()),
          *by = buffer(n, nullptr), *bmean = buffer(c, nullptr), *binv = buffer(c, nullptr),
          *bdx = buffer(n, nullptr), *bdg = buffer(c, nullptr), *bdb = buffer(c, nullptr);
    be.batch_norm_forward_training(rows, c, bx, nullptr, relu, bgamma, bbeta, eps, 0.1f, nullptr,
                                   nullptr, by, bmean, binv);
    be.batch_norm_backward(rows, c, bx, relu ? by : nullptr, relu, bdy, bgamma, bbeta, bmean, binv,
                           eps, bdx, bdg, bdb, nullptr);
    Run out{std::vector<float>(n), std::vector<float>(c), std::vector<float>(c),
            std::vector<float>(n), std::vector<float>(c), std::vector<float>(c)};
    be.copy_to_host(out.y.data(), by, n * sizeof(float));
    be.copy_to_host(out.mean.data(), bmean, c * sizeof(float));
    be.copy_to_host(out.invstd.data(), binv, c * sizeof(float));
    be.copy_to_host(out.dx.data(), bdx, n * sizeof(float));
    be.copy_to_host(out.dgamma.data(), bdg, c * sizeof(float));
    be.copy_to_host(out.dbeta.data(), bdb, c * sizeof(float));
    be.synchronize();
    for (float* p : {bx, bdy, bgamma, bbeta, by, bmean, binv, bdx, bdg, bdb}) a.deallocate(p);
    return out;
  };
  for (bool relu : {false, true}) {
    INFO("relu " << relu);
    const Run g = run(gb, relu), r = run(cb, relu);
    CHECK(std::fabs(r.invstd[1] - 1.0f / std::sqrt(eps)) < 1e-3f * r.invstd[1]);
    expect_close("batch_norm constant channel invstd", g.invstd, r.invstd, 1e-6, 1e-4);
    expect_close("batch_norm constant channel y", g.y, r.y, 1e-5, 1e-5);
    expect_close("batch_norm constant channel dx", g.dx, r.dx, 1e-4, 1e-4);
    expect_close("batch_norm constant channel dgamma", g.dgamma, r.dgamma, 1e-4, 1e-4);
    expect_close("batch_norm constant channel dbeta", g.dbeta, r.dbeta, 1e-5, 1e-5);
    CHECK(std::all_of(g.dx.begin(), g.dx.end(), [](float v) { return std::isfinite(v); }));
  }
}

TEST_CASE("gemm matches the CPU kernel for every transposition", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  const int m = 37, n = 29, k = 53;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
      const auto a = random_vector(std::size_t(ta ? k : m) * lda, 41);
      const auto b = random_vector(std::size_t(tb ? n : k) * ldb, 42);
      auto c = random_vector(std::size_t(m) * ldc, 43);
      auto ga = upload(a), gb = upload(b), gc = upload(c);
      gpu::gemm(ctx, ta, tb, m, n, k, 0.75f, ga.as<float>(), lda, gb.as<float>(), ldb, 0.5f,
                gc.as<float>(), ldc);
      cpu::gemm(the_cpu(), ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(),
                ldc);
      INFO("trans_a " << ta << " trans_b " << tb);
      expect_close("gemm", download(gc, c.size()), c, 1e-4, 1e-5);
    }
  REQUIRE_THROWS_AS(gpu::gemm(ctx, false, false, 4, 4, 4, 1.0f, nullptr, 2, nullptr, 4, 0.0f,
                              nullptr, 4),
                    tw::InvalidArgument);
}

// ---- 16-bit products on tensor cores -------------------------------------------------------------

namespace {

std::vector<float> rounded_to(gpu::Half t, std::vector<float> v) {
  for (float& x : v) x = t == gpu::Half::Bf16 ? tw::round_to_bf16(x) : tw::round_to_fp16(x);
  return v;
}

// How many of v are not exactly values of t (0 when v went through t: a tensor-core output).
std::size_t not_of_type(gpu::Half t, const std::vector<float>& v) {
  return std::size_t(std::count_if(v.begin(), v.end(), [&](float x) {
    const float r = t == gpu::Half::Bf16 ? tw::round_to_bf16(x) : tw::round_to_fp16(x);
    return std::memcmp(&r, &x, 4) != 0;
  }));
}

// The largest relative error of one rounding to t (2^-p for p significant bits: 8 in bf16, 11 in
// fp16): that of a cuDNN 16-bit output (Note [16-bit convolutions on tensor cores] in
// core/cuda/conv.cc).
double output_rounding(gpu::Half t) { return t == gpu::Half::Bf16 ? 0x1p-8 : 0x1p-11; }

// The GPU's 16-bit convolutions against the CPU's fp32 kernels on operands rounded to t: the same
// products, summed in another order (atol as the fp32 parity test's), and then the output rounded
// to t once (rtol). `tensor_cores` also asks that every output went through t, i.e. that cuDNN
// offered a 16-bit algorithm and the shape did not fall back to the emulated path.
void half_conv_parity(gpu::Half t, const char* name, const Conv2dShape& s, bool tensor_cores,
                      std::uint32_t seed) {
  auto& ctx = *the_gpu().ctx;
  const std::size_t nx = std::size_t(s.n) * s.h * s.w * s.c_in;
  const std::size_t ny = std::size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  const std::size_t nw = std::size_t(s.c_out) * s.c_in * s.kh * s.kw;
  const auto x = random_vector(nx, seed), w = random_vector(nw, seed + 1),
             dy = random_vector(ny, seed + 2);
  const auto xr = rounded_to(t, x), wr = rounded_to(t, w), dyr = rounded_to(t, dy);
  auto gx = upload(x), gw = upload(w), gdy = upload(dy);
  auto gy = device_zeros(ny), gdx = device_zeros(nx), gdw = device_zeros(nw);
  std::vector<float> y(ny), dx(nx), dw(nw);
  INFO(gpu::to_string(t) << " " << name << " (" << s.to_string() << ")");
  const double rtol = 1.01 * output_rounding(t);

  gpu::conv2d_forward_half(ctx, t, s, gx.as<float>(), gw.as<float>(), gy.as<float>());
  cpu::conv2d_forward(the_cpu(), s, xr.data(), wr.data(), y.data());
  const auto got_y = download(gy, ny);
  expect_close("conv2d_forward_half", got_y, y, 2e-6 * double(s.c_in) * s.kh * s.kw, rtol);

  gpu::conv2d_backward_input_half(ctx, t, s, gdy.as<float>(), gw.as<float>(), gdx.as<float>());
  cpu::conv2d_backward_input(the_cpu(), s, dyr.data(), wr.data(), dx.data());
  const auto got_dx = download(gdx, nx);
  expect_close("conv2d_backward_input_half", got_dx, dx, 2e-6 * double(s.c_out) * s.kh * s.kw,
               rtol);

  gpu::conv2d_backward_weight_half(ctx, t, s, gx.as<float>(), gdy.as<float>(), gdw.as<float>());
  cpu::conv2d_backward_weight(the_cpu(), s, xr.data(), dyr.data(), dw.data());
  const auto got_dw = download(gdw, nw);
  expect_close("conv2d_backward_weight_half", got_dw, dw,
               2e-6 * double(s.n) * s.out_h() * s.out_w(), rtol);

  const std::size_t off_y = not_of_type(t, got_y), off_dx = not_of_type(t, got_dx),
                    off_dw = not_of_type(t, got_dw);
  std::printf("[cuda] %s %-40s %s\n", gpu::to_string(t), name,
              off_y + off_dx + off_dw == 0 ? "tensor-core path (outputs in the 16-bit type)"
                                           : "emulated path (float32 outputs)");
  if (tensor_cores) {
    CHECK(off_y == 0);
    CHECK(off_dx == 0);
    CHECK(off_dw == 0);
  }
}

}  // namespace

TEST_CASE("float32 <-> bf16 and fp16 conversions round as the CPU does, bit for bit", "[cuda][bf16]") {
  auto& ctx = *the_gpu().ctx;
  std::vector<float> v = random_vector(5003, 104, -70000.0f, 70000.0f);
  const auto small = random_vector(997, 105, -1e-3f, 1e-3f);
  v.insert(v.end(), small.begin(), small.end());
  for (float extra : {0.0f, -0.0f, 65504.0f, 65520.0f, 5.9604645e-8f, 1e-9f, INFINITY, -INFINITY})
    v.push_back(extra);
  for (const gpu::Half t : {gpu::Half::Bf16, gpu::Half::Fp16}) {
    auto gv = upload(v);
    gpu::DeviceBuffer gh(ctx, v.size() * 2);
    auto gback = device_zeros(v.size());
    gpu::float_to_half(ctx, t, std::int64_t(v.size()), gv.as<float>(), gh.data());
    gpu::half_to_float(ctx, t, std::int64_t(v.size()), gh.data(), gback.as<float>());
    const auto back = download(gback, v.size());
    const auto want = rounded_to(t, v);
    int mismatches = 0;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (std::memcmp(&want[i], &back[i], 4) != 0) ++mismatches;
    INFO(gpu::to_string(t));
    CHECK(mismatches == 0);
  }
}

TEST_CASE("bf16 and fp16 convolutions on tensor cores match the CPU on rounded operands, every ResNet-20 and tfcnn shape",
          "[cuda][bf16]") {
  struct Case {
    const char* name;
    Conv2dShape s;
    bool tensor_cores;  // channels in multiples of 8: cuDNN's tensor-core kernels take them
  };
  const std::vector<Case> cases = {
      {"resnet20 conv1 3->16", {.n = 4, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}, false},
      {"resnet20 16->16", {.n = 4, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}, true},
      {"resnet20 16->32 stride 2", {.n = 4, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, true},
      {"resnet20 shortcut 1x1 16->32 stride 2", {.n = 4, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}, true},
      {"resnet20 32->32", {.n = 4, .h = 16, .w = 16, .c_in = 32, .c_out = 32, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}, true},
      {"resnet20 32->64 stride 2", {.n = 4, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1}, true},
      {"resnet20 shortcut 1x1 32->64 stride 2", {.n = 4, .h = 16, .w = 16, .c_in = 32, .c_out = 64, .kh = 1, .kw = 1, .stride_h = 2, .stride_w = 2}, true},
      {"resnet20 64->64", {.n = 4, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1}, true},
      {"tfcnn conv1 5x5 3->64", {.n = 4, .h = 32, .w = 32, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}, false},
      {"tfcnn conv2 5x5 64->64", {.n = 4, .h = 16, .w = 16, .c_in = 64, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2}, true},
      {"odd 5->7 on 7x9, no padding", {.n = 3, .h = 7, .w = 9, .c_in = 5, .c_out = 7, .kh = 3, .kw = 3}, false},
      {"odd 3x2 kernel, stride 2 dropping a column", {.n = 1, .h = 8, .w = 8, .c_in = 6, .c_out = 10, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 2}, false},
  };
  std::uint32_t seed = 200;
  for (const gpu::Half t : {gpu::Half::Bf16, gpu::Half::Fp16}) {
    if (!gpu::half_products_supported(*the_gpu().ctx, t)) {
      WARN("this GPU has no " << gpu::to_string(t) << " tensor cores; their kernels are not tested");
      continue;
    }
    for (const Case& c : cases) half_conv_parity(t, c.name, c.s, c.tensor_cores, seed += 3);
  }
}

TEST_CASE("bf16 and fp16 GEMM on tensor cores match the CPU on rounded operands", "[cuda][bf16]") {
  auto& ctx = *the_gpu().ctx;
  struct Case {
    int m, n, k;
  };
  // The models' fully connected layers at batch 128 (ResNet-20's 64->10, tfcnn's 4096->384,
  // 384->192, 192->10) and odd sizes.
  for (const gpu::Half t : {gpu::Half::Bf16, gpu::Half::Fp16}) {
    if (!gpu::half_products_supported(ctx, t)) continue;
    for (const Case c : {Case{128, 10, 64}, Case{128, 384, 4096}, Case{128, 192, 384},
                         Case{128, 10, 192}, Case{37, 29, 53}, Case{1, 7, 3}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int m = c.m, n = c.n, k = c.k;
          const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
          const auto a = random_vector(std::size_t(ta ? k : m) * lda, 51);
          const auto b = random_vector(std::size_t(tb ? n : k) * ldb, 52);
          const auto ar = rounded_to(t, a), br = rounded_to(t, b);
          std::vector<float> want(std::size_t(m) * ldc, 0.0f);
          auto ga = upload(a), gb = upload(b), gc = device_zeros(want.size());
          gpu::gemm_half(ctx, t, ta, tb, m, n, k, ga.as<float>(), lda, gb.as<float>(), ldb,
                         gc.as<float>(), ldc);
          cpu::gemm(the_cpu(), ta, tb, m, n, k, 1.0f, ar.data(), lda, br.data(), ldb, 0.0f,
                    want.data(), ldc);
          INFO(gpu::to_string(t) << " m " << m << " n " << n << " k " << k << " trans_a " << ta
                                 << " trans_b " << tb);
          // cuBLAS writes float32: only the order of the sums differs.
          expect_close("gemm_half", download(gc, want.size()), want, 2e-6 * k, 1e-5);
        }
  }
  REQUIRE_THROWS_AS(gpu::gemm_half(ctx, gpu::Half::Bf16, false, false, 4, 4, 4, nullptr, 2,
                                   nullptr, 4, nullptr, 4),
                    tw::InvalidArgument);
}

TEST_CASE("softmax and log-softmax forward and backward match a double reference", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  const std::int64_t rows = 13;
  const int classes = 37;
  const std::size_t n = std::size_t(rows) * classes;
  const auto x = random_vector(n, 51, -5.0f, 5.0f), dy = random_vector(n, 52);
  std::vector<float> sm(n), lsm(n), dsm(n), dlsm(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0, dot = 0, sdy = 0;
    for (int j = 0; j < classes; ++j) mx = std::max(mx, double(x[r * classes + j]));
    for (int j = 0; j < classes; ++j) s += std::exp(double(x[r * classes + j]) - mx);
    for (int j = 0; j < classes; ++j) {
      const std::size_t i = r * classes + j;
      sm[i] = float(std::exp(double(x[i]) - mx) / s);
      lsm[i] = float(double(x[i]) - mx - std::log(s));
      dot += double(dy[i]) * sm[i];
      sdy += dy[i];
    }
    for (int j = 0; j < classes; ++j) {
      const std::size_t i = r * classes + j;
      dsm[i] = float(sm[i] * (dy[i] - dot));
      dlsm[i] = float(dy[i] - std::exp(double(lsm[i])) * sdy);
    }
  }
  auto gx = upload(x), gdy = upload(dy), gy = device_zeros(n), gdx = device_zeros(n);
  gpu::softmax_forward(ctx, rows, classes, gx.as<float>(), gy.as<float>());
  expect_close("softmax_forward", download(gy, n), sm, 1e-7, 1e-5);
  gpu::softmax_backward(ctx, rows, classes, gy.as<float>(), gdy.as<float>(), gdx.as<float>());
  expect_close("softmax_backward", download(gdx, n), dsm, 1e-6, 1e-4);
  gpu::log_softmax_forward(ctx, rows, classes, gx.as<float>(), gy.as<float>());
  expect_close("log_softmax_forward", download(gy, n), lsm, 1e-5, 1e-5);
  gpu::log_softmax_backward(ctx, rows, classes, gy.as<float>(), gdy.as<float>(), gdx.as<float>());
  expect_close("log_softmax_backward", download(gdx, n), dlsm, 1e-5, 1e-4);
}

TEST_CASE("softmax cross-entropy, its gradient and top-k match the CPU backend", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  tw::Backend& cb = cpu_backend();
  const std::int64_t rows = 50;
  const int classes = 10;
  const std::size_t n = std::size_t(rows) * classes;
  const auto logits = random_vector(n, 61, -4.0f, 4.0f);
  std::vector<std::int32_t> labels(rows);
  for (std::int64_t r = 0; r < rows; ++r) labels[r] = std::int32_t((r * 7 + 3) % classes);
  const float scale = 128.0f;  // the global batch, larger than this tower's rows
  for (float smoothing : {0.0f, 0.1f}) {
    INFO("label smoothing " << smoothing);
    auto glog = upload(logits), glab = upload(labels);
    auto gloss = device_zeros(1), gprobs = device_zeros(n), gd = device_zeros(n);
    std::vector<float> loss(1), probs(n), d(n), dloss{2.0f};
    auto gdloss = upload(dloss);
    gpu::softmax_cross_entropy_forward(ctx, rows, classes, glog.as<float>(),
                                       glab.as<std::int32_t>(), scale, smoothing,
                                       gloss.as<float>(), gprobs.as<float>());
    cb.softmax_cross_entropy_forward(rows, classes, logits.data(), labels.data(), scale,
                                     smoothing, loss.data(), probs.data());
    expect_close("softmax_cross_entropy_forward loss", download(gloss, 1), loss, 1e-6, 1e-5);
    expect_close("softmax_cross_entropy_forward probs", download(gprobs, n), probs, 1e-7, 1e-5);
    gpu::softmax_cross_entropy_backward(ctx, rows, classes, gprobs.as<float>(),
                                        glab.as<std::int32_t>(), scale, smoothing,
                                        gdloss.as<float>(), gd.as<float>());
    cb.softmax_cross_entropy_backward(rows, classes, probs.data(), labels.data(), scale,
                                      smoothing, dloss.data(), d.data());
    expect_close("softmax_cross_entropy_backward", download(gd, n), d, 1e-8, 1e-5);
  }
  for (int k : {1, 3}) {
    auto glog = upload(logits), glab = upload(labels);
    auto gcorrect = device_zeros<std::int32_t>(1);
    std::int32_t correct = -1;
    gpu::top_k_correct(ctx, rows, classes, glog.as<float>(), glab.as<std::int32_t>(), k,
                       gcorrect.as<std::int32_t>());
    cb.top_k_correct(rows, classes, logits.data(), labels.data(), k, &correct);
    CHECK(download<std::int32_t>(gcorrect, 1)[0] == correct);
  }
  // Rows with a NaN or an infinity are never correct, on either backend (TensorFlow's InTopK).
  {
    auto bad_logits = logits;
    for (std::int64_t r = 0; r < rows; r += 3) {
      float* z = bad_logits.data() + r * classes;
      const float poison[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
      z[(r / 3) % 2 == 0 ? labels[r] : (labels[r] + 1) % classes] = poison[(r / 3) % 3];
    }
    for (int k : {1, classes}) {
      auto glog = upload(bad_logits), glab = upload(labels);
      auto gcorrect = device_zeros<std::int32_t>(1);
      std::int32_t correct = -1;
      gpu::top_k_correct(ctx, rows, classes, glog.as<float>(), glab.as<std::int32_t>(), k,
                         gcorrect.as<std::int32_t>());
      cb.top_k_correct(rows, classes, bad_logits.data(), labels.data(), k, &correct);
      INFO("k " << k);
      CHECK(download<std::int32_t>(gcorrect, 1)[0] == correct);
      if (k == classes) CHECK(correct == rows - (rows + 2) / 3);  // every finite row, none other
    }
  }
  // A label out of range is reported at the next synchronisation, naming it.
  auto bad = labels;
  bad[17] = classes + 5;
  auto glog = upload(logits), glab = upload(bad);
  auto gloss = device_zeros(1), gprobs = device_zeros(n);
  gpu::softmax_cross_entropy_forward(ctx, rows, classes, glog.as<float>(),
                                     glab.as<std::int32_t>(), scale, 0.0f, gloss.as<float>(),
                                     gprobs.as<float>());
  REQUIRE_THROWS_AS(ctx.synchronize(), tw::InvalidArgument);
  CHECK_NOTHROW(ctx.synchronize());  // reported once, then cleared
  gpu::softmax_cross_entropy_forward(ctx, rows, classes, glog.as<float>(),
                                     glab.as<std::int32_t>(), scale, 0.0f, gloss.as<float>(),
                                     gprobs.as<float>());
  REQUIRE_THROWS_WITH(ctx.synchronize(), Catch::Matchers::Contains("15") &&
                                             Catch::Matchers::Contains("row 17"));
}

TEST_CASE("elementwise ops, reductions and transposes match the CPU backend", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  tw::Backend& cb = cpu_backend();
  const std::int64_t rows = 300;
  const int c = 17;
  const std::size_t n = std::size_t(rows) * c;
  const auto a = random_vector(n, 71), b = random_vector(n, 72), bias = random_vector(c, 73);
  auto ga = upload(a), gb = upload(b), gbias = upload(bias);
  auto gy = device_zeros(n);
  std::vector<float> y(n);

  gpu::add(ctx, n, ga.as<float>(), gb.as<float>(), gy.as<float>());
  cb.add(n, a.data(), b.data(), y.data());
  expect_close("add", download(gy, n), y, 0.0, 0.0);
  gpu::mul(ctx, n, ga.as<float>(), gb.as<float>(), gy.as<float>());
  cb.mul(n, a.data(), b.data(), y.data());
  expect_close("mul", download(gy, n), y, 0.0, 0.0);
  gpu::scale(ctx, n, -1.5f, ga.as<float>(), gy.as<float>());
  cb.scale(n, -1.5f, a.data(), y.data());
  expect_close("scale", download(gy, n), y, 0.0, 0.0);
  gpu::axpy(ctx, n, 0.25f, gb.as<float>(), gy.as<float>());
  cb.axpy(n, 0.25f, b.data(), y.data());
  expect_close("axpy", download(gy, n), y, 1e-7, 1e-6);
  gpu::relu_forward(ctx, n, ga.as<float>(), gy.as<float>());
  cb.relu_forward(n, a.data(), y.data());
  expect_close("relu_forward", download(gy, n), y, 0.0, 0.0);
  auto gdx = device_zeros(n);
  std::vector<float> dx(n);
  gpu::relu_backward(ctx, n, gy.as<float>(), gb.as<float>(), gdx.as<float>());
  cb.relu_backward(n, y.data(), b.data(), dx.data());
  expect_close("relu_backward", download(gdx, n), dx, 0.0, 0.0);
  // GELU: CUDA's erff/expf against Eigen's vectorised erf/exp, a few ulp apart.
  gpu::gelu_forward(ctx, n, ga.as<float>(), gy.as<float>());
  cb.gelu_forward(n, a.data(), y.data());
  expect_close("gelu_forward", download(gy, n), y, 1e-6, 1e-6);
  gpu::gelu_backward(ctx, n, ga.as<float>(), gb.as<float>(), gdx.as<float>());
  cb.gelu_backward(n, a.data(), b.data(), dx.data());
  expect_close("gelu_backward", download(gdx, n), dx, 1e-6, 1e-6);
  gpu::bias_add(ctx, rows, c, ga.as<float>(), gbias.as<float>(), gy.as<float>());
  cb.bias_add(rows, c, a.data(), bias.data(), y.data());
  expect_close("bias_add", download(gy, n), y, 0.0, 0.0);
  gpu::fill(ctx, n, 3.25f, gy.as<float>());
  cb.fill(n, 3.25f, y.data());
  expect_close("fill", download(gy, n), y, 0.0, 0.0);

  auto gcol = device_zeros(c);
  std::vector<float> col(c);
  gpu::sum_rows(ctx, rows, c, ga.as<float>(), gcol.as<float>());
  cb.sum_rows(rows, c, a.data(), col.data());
  expect_close("sum_rows", download(gcol, c), col, 1e-5, 1e-5);
  auto gs = device_zeros(1);
  std::vector<float> s(1);
  gpu::sum(ctx, n, ga.as<float>(), gs.as<float>());
  cb.sum(n, a.data(), s.data());
  expect_close("sum", download(gs, 1), s, 1e-5, 1e-6);
  double sq = 0;
  for (float v : a) sq += double(v) * v;
  gpu::sum_squares(ctx, n, ga.as<float>(), gs.as<float>());
  expect_close("sum_squares", download(gs, 1), {float(sq)}, 1e-5, 1e-6);

  // NHWC <-> NCHW: n = 3 images of hw = 100 positions and c = 17 channels (n*hw*c = 5100 = n).
  const std::int64_t imgs = 3, hw = 100;
  gpu::transpose_batched(ctx, imgs, hw, c, ga.as<float>(), gy.as<float>());
  cb.nhwc_to_nchw(imgs, hw, c, a.data(), y.data());
  expect_close("nhwc_to_nchw", download(gy, n), y, 0.0, 0.0);
  auto gback = device_zeros(n);
  gpu::transpose_batched(ctx, imgs, c, hw, gy.as<float>(), gback.as<float>());
  expect_close("nchw_to_nhwc (round trip)", download(gback, n), a, 0.0, 0.0);
}

TEST_CASE("dropout keeps exactly the elements the CPU's hash keeps", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  const std::int64_t n = 100003;
  const float p = 0.3f;
  const std::uint64_t seed = 1234, offset = 777;
  const auto x = random_vector(n, 81), dy = random_vector(n, 82);
  auto gx = upload(x), gdy = upload(dy), gy = device_zeros(n), gdx = device_zeros(n);
  auto gmask = device_zeros<std::uint8_t>(n);
  gpu::dropout_forward(ctx, n, p, seed, offset, gx.as<float>(), gy.as<float>(),
                       gmask.as<std::uint8_t>());
  std::vector<float> y(n), dx(n);
  std::vector<std::uint8_t> mask(n);
  tw::Backend& cb = cpu_backend();
  cb.dropout_forward(n, p, seed, offset, x.data(), y.data(), mask.data());
  const auto gm = download<std::uint8_t>(gmask, n);
  std::int64_t kept = 0, differ = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    kept += gm[i];
    differ += (gm[i] != 0) != tw::dropout_keeps(seed, offset + i, p);
  }
  CHECK(differ == 0);
  CHECK(gm == mask);
  CHECK(std::abs(double(kept) / n - (1.0 - p)) < 0.01);
  expect_close("dropout_forward", download(gy, n), y, 0.0, 0.0);
  gpu::dropout_backward(ctx, n, p, gmask.as<std::uint8_t>(), gdy.as<float>(), gdx.as<float>());
  cb.dropout_backward(n, p, mask.data(), dy.data(), dx.data());
  expect_close("dropout_backward", download(gdx, n), dx, 0.0, 0.0);
  REQUIRE_THROWS_AS(gpu::dropout_forward(ctx, n, 1.0f, seed, 0, gx.as<float>(), gy.as<float>(),
                                         gmask.as<std::uint8_t>()),
                    tw::InvalidArgument);
}

TEST_CASE("optimizer updates follow PyTorch's formulas", "[cuda]") {
  auto& ctx = *the_gpu().ctx;
  const std::size_t n = 4099;
  const auto p0 = random_vector(n, 91);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(random_vector(n, 92 + t));

  // SGD: momentum 0.9, dampening 0, weight decay 5e-4, with and without Nesterov.
  for (bool nesterov : {false, true}) {
    const gpu::SgdStep base{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 5e-4f,
                            .nesterov = nesterov};
    auto gp = upload(p0), gbuf = device_zeros(n);
    std::vector<double> p(p0.begin(), p0.end()), buf(n, 0.0);
    for (int t = 0; t < 3; ++t) {
      auto gg = upload(grads[t]);
      gpu::SgdStep step = base;
      step.first_step = t == 0;
      gpu::sgd_update(ctx, n, gp.as<float>(), gg.as<float>(), gbuf.as<float>(), step);
      for (std::size_t i = 0; i < n; ++i) {
        double d = grads[t][i] + 5e-4 * p[i];
        buf[i] = t == 0 ? d : 0.9 * buf[i] + d;
        d = nesterov ? d + 0.9 * buf[i] : buf[i];
        p[i] -= 0.1 * d;
      }
    }
    INFO("nesterov " << nesterov);
    expect_close(nesterov ? "sgd_update (nesterov)" : "sgd_update (momentum)", download(gp, n),
                 std::vector<float>(p.begin(), p.end()), 1e-6, 1e-5);
  }
  // Adam and AdamW.
  for (bool decoupled : {false, true}) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-2f;
    auto gp = upload(p0), gm = device_zeros(n), gv = device_zeros(n);
    std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
    for (int t = 1; t <= 3; ++t) {
      auto gg = upload(grads[t - 1]);
      gpu::adam_update(ctx, n, gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(),
                       {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd,
                        .decoupled_weight_decay = decoupled, .step = t});
      for (std::size_t i = 0; i < n; ++i) {
        double g = grads[t - 1][i];
        if (decoupled)
          p[i] *= 1.0 - double(lr) * wd;
        else
          g += wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        const double mhat = m[i] / (1 - std::pow(double(b1), t));
        const double vhat = v[i] / (1 - std::pow(double(b2), t));
        p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
    }
    expect_close(decoupled ? "adam_update (AdamW)" : "adam_update (Adam)", download(gp, n),
                 std::vector<float>(p.begin(), p.end()), 1e-6, 1e-5);
  }
  auto gp = upload(p0), gg = upload(grads[0]);
  REQUIRE_THROWS_AS(gpu::sgd_update(ctx, n, gp.as<float>(), gg.as<float>(), nullptr,
                                    {.lr = 0.1f, .momentum = 0.9f}),
                    tw::InvalidArgument);
}

TEST_CASE("streams, events and copies: two contexts on one GPU, staging, device to device",
          "[cuda]") {
  Gpu& g = the_gpu();
  // A second logical device on the same physical GPU gets its own stream.
  gpu::GpuContext other(gpu::GpuContextOptions{.device = tw::Device::gpu(1), .ordinal = 0,
                                               .allocator = g.allocator.get()});
  CHECK(other.raw_stream() != g.ctx->raw_stream());
  CHECK(other.raw_stream() != nullptr);

  // 10 MiB + 3 bytes: more than two staging buffers' worth, and an odd tail.
  const std::size_t bytes = (std::size_t{10} << 20) + 3;
  std::vector<unsigned char> host(bytes), back(bytes, 0);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 131 + 7);
  gpu::DeviceBuffer a(*g.ctx, bytes), b(other, bytes);
  gpu::GpuEvent start(*g.ctx, true), stop(*g.ctx, true);
  start.record();
  gpu::copy_to_device(*g.ctx, a.data(), host.data(), bytes);
  stop.record();
  gpu::copy_between_devices(other, b.data(), *g.ctx, a.data(), bytes);
  gpu::copy_to_host(other, back.data(), b.data(), bytes);
  CHECK(std::memcmp(host.data(), back.data(), bytes) == 0);
  stop.synchronize();
  CHECK(stop.done());
  const float ms = stop.elapsed_ms_since(start);
  std::printf("[cuda] host-to-device copy of %zu bytes: %.3f ms (pageable source, staged)\n",
              bytes, ms);
  CHECK(ms >= 0.0f);

  // Pinned memory and the asynchronous copies.
  gpu::PinnedBuffer pinned(1024);
  for (int i = 0; i < 256; ++i) pinned.as<float>()[i] = float(i);
  gpu::copy_to_device_async(*g.ctx, a.data(), pinned.data(), 1024);
  gpu::PinnedBuffer out(1024);
  gpu::copy_to_host_async(*g.ctx, out.data(), a.data(), 1024);
  g.ctx->synchronize();
  CHECK(std::memcmp(pinned.data(), out.data(), 1024) == 0);

  // An event orders one stream after another without blocking the host.
  gpu::fill(*g.ctx, 256, 7.0f, a.as<float>());
  gpu::GpuEvent filled(*g.ctx);
  filled.record();
  filled.make_wait(other);
  gpu::copy_device_to_device(other, b.data(), a.data(), 1024);
  std::vector<float> seen(256);
  gpu::copy_to_host(other, seen.data(), b.data(), 1024);
  CHECK(std::all_of(seen.begin(), seen.end(), [](float v) { return v == 7.0f; }));
}

TEST_CASE("the GPU backend is reachable through the registry", "[cuda]") {
  // Growth, so the registry's pool does not reserve the memory this suite's own pool uses.
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  tw::Backend& be = tw::backend_for(tw::Device::gpu(0));
  CHECK(be.device() == tw::Device::gpu(0));
  CHECK(be.name().find("CUDA") != std::string::npos);
  CHECK(be.supports(tw::OpKind::kConv2d));
  void* p = be.allocator().allocate(64 * sizeof(float));
  be.fill(64, 2.5f, static_cast<float*>(p));
  std::vector<float> v(64);
  be.copy_to_host(v.data(), p, 64 * sizeof(float));
  be.allocator().deallocate(p);
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 2.5f; }));
  // The backend's own context is reachable for work outside the op set (optimizer updates).
  const gpu::GpuContext& ctx = gpu::context_for(tw::Device::gpu(0));
  CHECK(ctx.device() == tw::Device::gpu(0));
  CHECK(ctx.raw_stream() != the_gpu().ctx->raw_stream());
}

namespace {

// Relative L2 error of a against the reference b, with the max abs error printed.
double relative_l2(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0, max_abs = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - b[i];
    num += d * d;
    den += double(b[i]) * b[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  std::printf("[cuda] %-36s n=%-8zu relative L2 err %.3e, max abs err %.3e\n", what, a.size(),
              rel, max_abs);
  return rel;
}

}  // namespace

TEST_CASE("a whole ResNet-20 training step on the GPU matches the CPU", "[cuda]") {
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  const int n = 8;
  const auto images = random_vector(std::size_t(n) * 32 * 32 * 3, 101);
  std::vector<std::int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = (i * 3) % 10;

  struct Step {
    std::vector<float> logits, loss, grads, params, buffers;
  };
  auto run = [&](const tw::Device& device) {
    auto model = tw::models::make_model("resnet20", device, {.num_classes = 10, .seed = 5});
    model->zero_grad();
    const tw::Tensor x = tw::Tensor::from_host(std::span<const float>(images), {n, 32, 32, 3},
                                               device);
    const tw::Tensor y = tw::Tensor::from_host(std::span<const std::int32_t>(labels), {n}, device);
    const tw::Tensor logits = model->forward(x);
    const tw::Tensor loss = tw::softmax_cross_entropy(logits, y, {.scale = 2.0f * n});
    loss.backward();
    Step s{logits.to_host(), loss.to_host(), model->flat_gradients().to_host(), {}, {}};
    for (const auto& [name, t] : model->named_buffers()) {
      const auto v = t.to_host();
      s.buffers.insert(s.buffers.end(), v.begin(), v.end());
    }
    // The update: SGD with momentum and weight decay, first step (buf = d), p -= lr * buf.
    const float lr = 0.1f, wd = 5e-4f;
    if (device.is_gpu()) {
      // On the device's own stream, right after the backward that made the gradients.
      const gpu::GpuContext& dev_ctx = gpu::context_for(device);
      const tw::Tensor p = model->flat_parameters(), g = model->flat_gradients();
      const tw::Tensor buf = tw::Tensor::zeros(p.shape(), device);
      gpu::sgd_update(dev_ctx, p.numel(), p.data<float>(), g.data<float>(), buf.data<float>(),
                      {.lr = lr, .momentum = 0.9f, .weight_decay = wd, .first_step = true});
      dev_ctx.synchronize();
      s.params = p.to_host();
    } else {
      s.params = model->flat_parameters().to_host();
      for (std::size_t i = 0; i < s.params.size(); ++i)
        s.params[i] -= lr * (s.grads[i] + wd * s.params[i]);
    }
    return s;
  };
  const Step c = run(tw::Device::cpu(0));
  const Step g = run(tw::Device::gpu(0));
  // Twenty layers of batch norm amplify rounding differences; the tolerances are per quantity.
  expect_close("resnet20 logits", g.logits, c.logits, 1e-3, 1e-3);
  expect_close("resnet20 loss", g.loss, c.loss, 1e-5, 1e-4);
  CHECK(relative_l2("resnet20 flat gradients", g.grads, c.grads) < 1e-3);
  CHECK(relative_l2("resnet20 running statistics", g.buffers, c.buffers) < 1e-4);
  CHECK(relative_l2("resnet20 parameters after SGD", g.params, c.params) < 1e-6);
}

TEST_CASE("max_pool2d_relu (tfcnn's pooling) on the GPU matches the CPU, forward and backward", "[cuda]") {
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  const auto v = random_vector(std::size_t(2) * 9 * 7 * 5, 77);
  auto run = [&](const tw::Device& d) {
    tw::Tensor x = tw::Tensor::from_host(std::span<const float>(v), {2, 9, 7, 5}, d);
    x.set_requires_grad(true);
    const tw::Tensor y = tw::max_pool2d_relu(x, {.kernel = 3, .stride = 2, .padding = 1});
    tw::sum(y).backward();
    return std::pair{y.to_host(), x.grad().to_host()};
  };
  const auto [cy, cdx] = run(tw::Device::cpu(0));
  const auto [gy, gdx] = run(tw::Device::gpu(0));
  expect_close("max_pool2d_relu forward", gy, cy, 0.0, 0.0);
  expect_close("max_pool2d_relu backward", gdx, cdx, 0.0, 0.0);
}

// The fused op runs the base class's two passes on the GPU (max_pool_backward, then
// conv2d_backward_bias over its output) where the CPU sums the bias's gradient in the pool's pass.
TEST_CASE("conv2d_max_pool2d_relu (tfcnn's conv and pooling) on the GPU matches the CPU, forward and backward", "[cuda]") {
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  const auto vx = random_vector(std::size_t(2) * 9 * 7 * 3, 78);
  const auto vw = random_vector(std::size_t(16) * 3 * 5 * 5, 79);
  const auto vb = random_vector(16, 80);
  auto run = [&](const tw::Device& d) {
    tw::Tensor x = tw::Tensor::from_host(std::span<const float>(vx), {2, 9, 7, 3}, d);
    tw::Tensor w = tw::Tensor::from_host(std::span<const float>(vw), {16, 3, 5, 5}, d);
    tw::Tensor b = tw::Tensor::from_host(std::span<const float>(vb), {16}, d);
    for (tw::Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    const tw::Tensor y = tw::conv2d_max_pool2d_relu(x, w, b, {.stride = 1, .padding = 2},
                                                    {.kernel = 3, .stride = 2, .padding = 1});
    tw::sum(y).backward();
    return std::vector<std::vector<float>>{y.to_host(), x.grad().to_host(), w.grad().to_host(), b.grad().to_host()};
  };
  const auto c = run(tw::Device::cpu(0));
  const auto g = run(tw::Device::gpu(0));
  expect_close("conv2d_max_pool2d_relu forward", g[0], c[0], 1e-5, 1e-4);
  expect_close("conv2d_max_pool2d_relu dx", g[1], c[1], 1e-5, 1e-4);
  expect_close("conv2d_max_pool2d_relu dw", g[2], c[2], 1e-5, 1e-4);
  expect_close("conv2d_max_pool2d_relu db", g[3], c[3], 1e-5, 1e-4);
}

TEST_CASE("bf16 and fp16 on the GPU: the roundings equal the CPU's bit for bit, and ResNet-20 steps match the CPU's bf16 and fp16 steps",
          "[cuda][bf16]") {
  tw::initialise_devices(tw::ProcessOptions{.allow_growth = true});
  // The rounding: ties to even both ways, NaN and infinities kept, overflow to infinity.
  std::vector<float> v = random_vector(4099, 102);
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  const tw::Tensor gv = tw::Tensor::from_host(std::span<const float>(v), {std::int64_t(v.size())}, tw::Device::gpu(0));
  const tw::Tensor gr = tw::Tensor::empty(gv.shape(), tw::Device::gpu(0));
  tw::backend_for(tw::Device::gpu(0)).round_to_bf16(gv.numel(), gv.data<float>(), gr.data<float>());
  const std::vector<float> got = gr.to_host();
  int mismatches = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float want = tw::round_to_bf16(v[i]);
    if (std::isnan(want) ? !std::isnan(got[i]) : std::memcmp(&want, &got[i], 4) != 0) ++mismatches;
  }
  CHECK(mismatches == 0);
  // fp16's rounding the same way (overflow to infinity past 65504, subnormals down to 2^-24).
  for (float extra : {65504.0f, 65519.0f, 65520.0f, 5.9604645e-8f, 2.9802322e-8f, 1e-9f}) v.push_back(extra);
  const tw::Tensor hv = tw::Tensor::from_host(std::span<const float>(v), {std::int64_t(v.size())}, tw::Device::gpu(0));
  const tw::Tensor hr = tw::Tensor::empty(hv.shape(), tw::Device::gpu(0));
  tw::backend_for(tw::Device::gpu(0)).round_to_fp16(hv.numel(), hv.data<float>(), hr.data<float>());
  const std::vector<float> got16 = hr.to_host();
  int mismatches16 = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float want = tw::round_to_fp16(v[i]);
    if (std::isnan(want) ? !std::isnan(got16[i]) : std::memcmp(&want, &got16[i], 4) != 0) ++mismatches16;
  }
  CHECK(mismatches16 == 0);

  // A training step in bf16 and in fp16. The GPU multiplies on tensor cores, the CPU runs its bf16
  // kernels or rounds the operands for its fp32 ones: the products are the same, but the GPU's
  // convolution outputs and weight gradients are rounded once more to the 16-bit type (Note
  // [16-bit convolutions on tensor cores] in core/cuda/conv.cc), at most 2^-8 relative in bf16 and
  // 2^-11 in fp16 per layer, which twenty layers of batch norm carry to the logits and gradients.
  // The logits keep fixed bounds (about sqrt(20) layers x 2^-8 times batch norm's amplification
  // over a batch of 8, and an eighth of it for fp16). The gradients do not: the CPU's own 16-bit
  // gradients are 0.07 (fp16) to 0.2 (bf16) from its fp32 ones, and the GPU's, rounded
  // independently, as far again, so GPU and CPU 16-bit gradients sit about sqrt(2) times that
  // apart. Each GPU 16-bit gradient is therefore held to the fp32 gradient: no further from it
  // than twice the CPU's 16-bit gradient is.
  const int n = 8;
  const auto images = random_vector(std::size_t(n) * 32 * 32 * 3, 103);
  std::vector<std::int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = (i * 7) % 10;
  auto step = [&](const tw::Device& device, tw::Precision precision) {
    const tw::PrecisionScope scope(precision);
    auto model = tw::models::make_model("resnet20", device, {.num_classes = 10, .seed = 6});
    model->zero_grad();
    const tw::Tensor x = tw::Tensor::from_host(std::span<const float>(images), {n, 32, 32, 3}, device);
    const tw::Tensor y = tw::Tensor::from_host(std::span<const std::int32_t>(labels), {n}, device);
    const tw::Tensor logits = model->forward(x);
    tw::softmax_cross_entropy(logits, y, {.scale = float(n)}).backward();
    return std::pair{logits.to_host(), model->flat_gradients().to_host()};
  };
  std::printf("[cuda] 16-bit products on the GPU: bf16 %s, fp16 %s\n",
              tw::backend_for(tw::Device::gpu(0)).describe_products(tw::Precision::Bf16).c_str(),
              tw::backend_for(tw::Device::gpu(0)).describe_products(tw::Precision::Fp16).c_str());
  const auto c32 = step(tw::Device::cpu(0), tw::Precision::Fp32);
  const auto c = step(tw::Device::cpu(0), tw::Precision::Bf16);
  const auto g = step(tw::Device::gpu(0), tw::Precision::Bf16);
  CHECK(relative_l2("resnet20 bf16 logits", g.first, c.first) < 3e-2);
  relative_l2("resnet20 bf16 flat gradients", g.second, c.second);  // printed, bounded below
  const double cpu_bf16_error = relative_l2("resnet20 bf16 flat gradients, CPU vs CPU fp32", c.second, c32.second);
  CHECK(relative_l2("resnet20 bf16 flat gradients, GPU vs CPU fp32", g.second, c32.second) < 2 * cpu_bf16_error);
  const auto c16 = step(tw::Device::cpu(0), tw::Precision::Fp16);
  const auto g16 = step(tw::Device::gpu(0), tw::Precision::Fp16);
  CHECK(relative_l2("resnet20 fp16 logits", g16.first, c16.first) < 1e-2);
  relative_l2("resnet20 fp16 flat gradients", g16.second, c16.second);
  const double cpu_fp16_error = relative_l2("resnet20 fp16 flat gradients, CPU vs CPU fp32", c16.second, c32.second);
  CHECK(relative_l2("resnet20 fp16 flat gradients, GPU vs CPU fp32", g16.second, c32.second) < 2 * cpu_fp16_error);
}

int main(int argc, char** argv) {
  const gpu::CudaAvailability a = gpu::cuda_availability();
  if (!a.usable()) {
    std::printf("SKIPPED: no CUDA device (%s)\n", a.reason.c_str());
    return 77;
  }
  std::printf("[cuda] %s\n", gpu::describe(a).c_str());
  return Catch::Session().run(argc, argv);
}
