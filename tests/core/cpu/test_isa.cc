// The kernels of every instruction set this CPU supports give the baseline's results (to the
// rounding that FMA contraction and another summation width allow), on the ResNet-20 and tfcnn
// layer shapes and odd ones; and the choice of instruction set follows the CPU and the
// environment.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <tuple>

#include "core/cpu/batch_norm.h"
#include "core/cpu/conv.h"
#include "core/cpu/elementwise.h"
#include "core/cpu/gemm.h"
#include "core/cpu/isa.h"
#include "core/cpu/pool.h"
#include "core/error.h"
#include "kernel_test_util.h"

using namespace towerflow::cpu;
using towerflow::Conv2dShape;
using towerflow::Pool2dShape;
using namespace towerflow::cpu::testing;

namespace {

// Runs fn under every supported instruction set, comparing each result with the first one's.
void across_isas(const std::string& what, const std::function<std::vector<float>()>& fn, double tolerance) {
  const auto isas = supported_isas();
  REQUIRE_FALSE(isas.empty());
  force_isa_for_testing(isas.front());
  const std::vector<float> reference = fn();
  for (std::size_t i = 1; i < isas.size(); ++i) {
    force_isa_for_testing(isas[i]);
    REQUIRE(active_isa() == isas[i]);
    const auto c = compare(fn(), reference);
    INFO(what << ": " << isa_name(isas[i]) << " against " << isa_name(isas.front()) << ": " << c.describe());
    CHECK(c.max_error <= tolerance);
  }
  force_isa_for_testing(std::nullopt);
}

}  // namespace

TEST_CASE("every supported instruction set's kernels agree with the lowest one's", "[cpu][isa]") {
  INFO("CPU features: " << cpu_features());
  CpuContext ctx(2);
  const std::vector<Conv2dShape> convs{
      {.n = 4, .h = 32, .w = 32, .c_in = 3, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},    // resnet20 stem
      {.n = 4, .h = 32, .w = 32, .c_in = 16, .c_out = 16, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},   // layer1
      {.n = 4, .h = 32, .w = 32, .c_in = 16, .c_out = 32, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1},
      {.n = 4, .h = 8, .w = 8, .c_in = 64, .c_out = 64, .kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1},     // layer3
      {.n = 2, .h = 32, .w = 32, .c_in = 3, .c_out = 64, .kh = 5, .kw = 5, .pad_h = 2, .pad_w = 2},    // tfcnn conv1
      {.n = 3, .h = 7, .w = 9, .c_in = 5, .c_out = 11, .kh = 2, .kw = 3, .stride_h = 2, .pad_w = 1}};  // odd
  for (const auto& s : convs) {
    const auto x = random_vector(static_cast<std::size_t>(s.n) * s.h * s.w * s.c_in, 1);
    const auto w = random_vector(static_cast<std::size_t>(s.c_out) * s.c_in * s.kh * s.kw, 2);
    const auto dy = random_vector(static_cast<std::size_t>(s.n) * s.out_h() * s.out_w() * s.c_out, 3);
    across_isas("conv forward " + s.to_string(), [&] {
      std::vector<float> y(dy.size());
      conv2d_forward(ctx, s, x.data(), w.data(), y.data());
      return y;
    }, 1e-4);
    across_isas("conv backward input " + s.to_string(), [&] {
      std::vector<float> dx(x.size());
      conv2d_backward_input(ctx, s, dy.data(), w.data(), dx.data());
      return dx;
    }, 1e-4);
    across_isas("conv backward weight " + s.to_string(), [&] {
      std::vector<float> dw(w.size());
      conv2d_backward_weight(ctx, s, x.data(), dy.data(), dw.data());
      return dw;
    }, 1e-4);
  }
  for (int c : {16, 64, 13}) {
    const std::int64_t rows = 4 * 32 * 32 + 7;
    const auto x = random_vector(static_cast<std::size_t>(rows) * c, 4);
    const auto dy = random_vector(x.size(), 5);
    const auto gamma = random_vector(static_cast<std::size_t>(c), 6);
    const auto beta = random_vector(static_cast<std::size_t>(c), 7);
    across_isas("batch norm + relu forward and backward, c=" + std::to_string(c), [&] {
      std::vector<float> y(x.size()), mean(c), invstd(c), dx(x.size()), dg(c), db(c), dpre(x.size());
      batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f, y.data(), mean.data(),
                                       invstd.data());
      batch_norm_relu_backward(ctx, rows, c, x.data(), y.data(), dy.data(), gamma.data(), nullptr, mean.data(),
                               invstd.data(), dx.data(), dg.data(), db.data(), dpre.data());
      std::vector<float> dx_from_x(x.size());
      batch_norm_relu_backward(ctx, rows, c, x.data(), nullptr, dy.data(), gamma.data(), beta.data(), mean.data(),
                               invstd.data(), dx_from_x.data(), dg.data(), db.data(), nullptr);
      y.insert(y.end(), dx_from_x.begin(), dx_from_x.end());
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dg.begin(), dg.end());
      return y;
    }, 1e-3);
  }
  {
    const Pool2dShape s{.n = 4, .h = 32, .w = 32, .c = 64, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
    const auto x = random_vector(static_cast<std::size_t>(s.n) * s.h * s.w * s.c, 8);
    across_isas("max pool (tfcnn)", [&] {
      std::vector<float> y(static_cast<std::size_t>(s.n) * s.out_h() * s.out_w() * s.c);
      std::vector<std::int32_t> arg(y.size());
      max_pool_forward(ctx, s, x.data(), y.data(), arg.data());
      return y;
    }, 0.0);
  }
  {
    const std::int64_t n = 100003;
    const auto x = random_vector(static_cast<std::size_t>(n), 11);
    const auto dy = random_vector(static_cast<std::size_t>(n), 12);
    across_isas("relu forward and backward, bias_add", [&] {
      std::vector<float> y(x.size()), dx(x.size()), b(x.size());
      relu_forward(ctx, n, x.data(), y.data());
      relu_backward(ctx, n, y.data(), dy.data(), dx.data());
      bias_add(ctx, n / 7, 7, x.data(), dy.data(), b.data());
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), b.begin(), b.end());
      return y;
    }, 0.0);
    across_isas("axpy", [&] {
      std::vector<float> y = dy;
      axpy(ctx, n, 0.3f, x.data(), y.data());
      return y;
    }, 1e-6);
  }
  for (auto [m, n, k] : {std::tuple{128, 384, 4096}, std::tuple{64, 10, 64}, std::tuple{7, 5, 3}}) {
    const auto a = random_vector(static_cast<std::size_t>(m) * k, 9);
    const auto b = random_vector(static_cast<std::size_t>(k) * n, 10);
    across_isas("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k), [&] {
      std::vector<float> c(static_cast<std::size_t>(m) * n);
      gemm(ctx, false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
      return c;
    }, 1e-4);
  }
}

TEST_CASE("the instruction set follows the CPU and TOWERFLOW_CPU_ISA", "[cpu][isa]") {
  const auto built = built_isas();
  const auto supported = supported_isas();
  REQUIRE_FALSE(supported.empty());
  const std::string features = cpu_features();
  INFO("CPU features: " << features);
  // What CPUID says, independently: /proc/cpuinfo's flags name the same instructions.
  auto has = [&](const char* f) { return features.find(f) != std::string::npos; };
  if (built.front() == Isa::Baseline) {
    CHECK((std::find(supported.begin(), supported.end(), Isa::Avx2) != supported.end()) == (has("avx2") && has("fma")));
    CHECK((std::find(supported.begin(), supported.end(), Isa::Avx512) != supported.end()) ==
          (has("avx512f") && has("avx512bw") && has("avx512vl")));
  }
  if (const char* env = std::getenv("TOWERFLOW_CPU_ISA")) {
    // Run under tests/core/cpu/run_on_isa.sh: the whole kernel suite on that path.
    CHECK(std::string(isa_name(active_isa())) == env);
    CHECK_THAT(describe_active_isa(), Catch::Contains("TOWERFLOW_CPU_ISA"));
  } else {
    CHECK(active_isa() == supported.back());
    CHECK_THAT(describe_active_isa(), Catch::Contains("the best this CPU supports"));
  }
  CHECK_THROWS_AS(force_isa_for_testing(static_cast<Isa>(99)), towerflow::InvalidArgument);
}

TEST_CASE("transpose puts every element of each matrix at its transposed place on every instruction set", "[cpu][isa]") {
  CpuContext ctx(2);
  // tfcnn's flatten (64 pixels x 64 channels, both ways), whole 8x8 blocks with edges of every
  // width, single rows and columns.
  for (auto [n, rows, cols] : {std::tuple{3, 64, 64}, std::tuple{2, 13, 21}, std::tuple{1, 1, 9},
                               std::tuple{2, 8, 16}, std::tuple{4, 17, 8}, std::tuple{1, 3, 1024},
                               std::tuple{5, 9, 1}}) {
    std::vector<float> x(static_cast<std::size_t>(n) * rows * cols);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);  // every element distinct
    std::vector<float> expected(x.size());
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j)
          expected[(std::size_t(b) * cols + j) * rows + i] = x[(std::size_t(b) * rows + i) * cols + j];
    for (Isa isa : supported_isas()) {
      force_isa_for_testing(isa);
      std::vector<float> y(x.size(), -1.0f);
      transpose(ctx, n, rows, cols, x.data(), y.data());
      INFO(isa_name(isa) << ": " << n << " matrices of " << rows << "x" << cols);
      CHECK(y == expected);
    }
    force_isa_for_testing(std::nullopt);
  }
}

// A transpose of 1 MiB or more whose rows come in sixteens, into a 64-byte aligned y, is written
// with streaming stores (kStreamingTransposeBytes in core/cpu/elementwise.cc); the same call into a
// buffer 16 bytes off that alignment, or with rows not a multiple of 16, takes the plain stores.
// Every way gives each element its transposed place, on every instruction set.
TEST_CASE("transposes written with streaming stores put every element at its transposed place", "[cpu][isa]") {
  CpuContext ctx(2);
  // tfcnn's flatten at batch 64 and 128 (1 and 2 MiB, both ways), a wide one, and 72 rows.
  for (auto [n, rows, cols] : {std::tuple{64, 64, 64}, std::tuple{128, 64, 64}, std::tuple{3, 96, 1024},
                               std::tuple{4, 72, 1024}}) {
    const std::size_t size = static_cast<std::size_t>(n) * rows * cols;
    REQUIRE(size * sizeof(float) >= std::size_t{1} << 20);
    std::vector<float> x(size);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);  // every element distinct
    std::vector<float> expected(size);
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j)
          expected[(std::size_t(b) * cols + j) * rows + i] = x[(std::size_t(b) * rows + i) * cols + j];
    std::unique_ptr<float[], void (*)(float*)> buffer(
        static_cast<float*>(::operator new[]((size + 16) * sizeof(float), std::align_val_t{64})),
        [](float* p) { ::operator delete[](p, std::align_val_t{64}); });
    for (Isa isa : supported_isas()) {
      force_isa_for_testing(isa);
      for (const std::size_t offset : {std::size_t{0}, std::size_t{4}}) {
        float* y = buffer.get() + offset;
        std::fill(y, y + size, -1.0f);
        transpose(ctx, n, rows, cols, x.data(), y);
        INFO(isa_name(isa) << ": " << n << " matrices of " << rows << "x" << cols << ", y " << offset * sizeof(float)
                           << " bytes past a 64-byte boundary");
        CHECK(std::equal(y, y + size, expected.begin()));
      }
    }
    force_isa_for_testing(std::nullopt);
  }
}

TEST_CASE("sum_rows gives each column's sum over the rows in double on every instruction set and thread count", "[cpu][isa]") {
  // The dense layers' bias gradients (tfcnn's 384 and 192, ResNet-20's 10), strips with edges of
  // every width, no rows.
  for (auto [rows, c] : {std::pair{128, 384}, std::pair{128, 10}, std::pair{1000, 33}, std::pair{3, 17},
                         std::pair{5, 1}, std::pair{0, 7}}) {
    const auto x = random_vector(static_cast<std::size_t>(rows) * c, 13);
    std::vector<float> expected(static_cast<std::size_t>(c));
    for (int j = 0; j < c; ++j) {
      double total = 0.0;
      for (int r = 0; r < rows; ++r) total += x[static_cast<std::size_t>(r) * c + j];
      expected[static_cast<std::size_t>(j)] = static_cast<float>(total);
    }
    for (Isa isa : supported_isas()) {
      force_isa_for_testing(isa);
      for (int threads : {1, 3}) {
        CpuContext ctx(threads);
        std::vector<float> out(static_cast<std::size_t>(c), -1.0f);
        sum_rows(ctx, rows, c, x.data(), out.data());
        INFO(isa_name(isa) << ", " << threads << " threads: " << rows << " rows of " << c);
        CHECK(out == expected);
      }
    }
    force_isa_for_testing(std::nullopt);
  }
}
