#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/cpu/batch_norm.h"
#include "core/cpu/kernel_test_util.h"
#include "core/error.h"

using namespace towerflow::cpu;
using namespace towerflow::cpu::testing;

namespace {

struct RefForward {
  std::vector<double> y, mean, invstd;
};

// Textbook batch norm in double: mean, biased variance, normalise, scale and shift.
RefForward ref_forward(std::int64_t rows, int c, const std::vector<float>& x,
                       const std::vector<float>& gamma, const std::vector<float>& beta, double eps) {
  RefForward r{std::vector<double>(x.size()), std::vector<double>(c), std::vector<double>(c)};
  for (int ch = 0; ch < c; ++ch) {
    double m = 0.0, v = 0.0;
    for (std::int64_t i = 0; i < rows; ++i) m += x[i * c + ch];
    m /= rows;
    for (std::int64_t i = 0; i < rows; ++i) v += (x[i * c + ch] - m) * (x[i * c + ch] - m);
    v /= rows;
    r.mean[ch] = m;
    r.invstd[ch] = 1.0 / std::sqrt(v + eps);
    for (std::int64_t i = 0; i < rows; ++i)
      r.y[i * c + ch] = (x[i * c + ch] - m) * r.invstd[ch] * gamma[ch] + beta[ch];
  }
  return r;
}

// The standard closed form of the batch-norm gradient, written from its derivation.
void ref_backward(std::int64_t rows, int c, const std::vector<float>& x, const std::vector<double>& g,
                  const std::vector<float>& gamma, const RefForward& f, std::vector<double>& dx,
                  std::vector<double>& dgamma, std::vector<double>& dbeta) {
  dx.assign(x.size(), 0.0);
  dgamma.assign(c, 0.0);
  dbeta.assign(c, 0.0);
  for (int ch = 0; ch < c; ++ch) {
    for (std::int64_t i = 0; i < rows; ++i) {
      const double xhat = (x[i * c + ch] - f.mean[ch]) * f.invstd[ch];
      dbeta[ch] += g[i * c + ch];
      dgamma[ch] += g[i * c + ch] * xhat;
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const double xhat = (x[i * c + ch] - f.mean[ch]) * f.invstd[ch];
      dx[i * c + ch] = gamma[ch] * f.invstd[ch] / rows *
                       (rows * g[i * c + ch] - dbeta[ch] - xhat * dgamma[ch]);
    }
  }
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("batch norm training forward and backward match the reference", "[cpu][bn]") {
  CpuContext ctx(2);
  // Odd row counts and channel counts, a large mean (shifted sums must keep the variance), and
  // enough rows to span several reduction blocks.
  struct Case {
    std::int64_t rows;
    int c;
    float offset;
  };
  for (const Case& k : {Case{1, 3, 0.0f}, Case{7, 5, 0.0f}, Case{2000, 19, 100.0f}, Case{4099, 16, -3.0f}}) {
    INFO("rows " << k.rows << " c " << k.c << " offset " << k.offset);
    auto x = random_vector(std::size_t(k.rows * k.c), 10, 2.0f);
    for (auto& v : x) v += k.offset;
    const auto gamma = random_vector(std::size_t(k.c), 11);
    const auto beta = random_vector(std::size_t(k.c), 12);
    const auto dy = random_vector(x.size(), 13);
    const float eps = 1e-5f;
    std::vector<float> y(x.size(), NAN), mean(k.c, NAN), invstd(k.c, NAN);
    batch_norm_forward_training(ctx, k.rows, k.c, x.data(), gamma.data(), beta.data(), eps,
                                y.data(), mean.data(), invstd.data());
    const auto ref = ref_forward(k.rows, k.c, x, gamma, beta, eps);
    const auto cy = compare(y, ref.y), cm = compare(mean, ref.mean), ci = compare(invstd, ref.invstd);
    INFO("y: " << cy.describe() << "; mean: " << cm.describe() << "; invstd: " << ci.describe());
    // One row: the variance is 0 and y = beta exactly.
    const double tol = k.offset != 0.0f ? 2e-4 : 1e-5;
    CHECK(cy.max_error < tol);
    CHECK(cm.max_error < 1e-6);
    CHECK(ci.max_error < tol);

    std::vector<float> dx(x.size(), NAN), dgamma(k.c, NAN), dbeta(k.c, NAN);
    batch_norm_backward(ctx, k.rows, k.c, x.data(), dy.data(), gamma.data(), mean.data(),
                        invstd.data(), dx.data(), dgamma.data(), dbeta.data());
    std::vector<double> rdx, rdg, rdb;
    ref_backward(k.rows, k.c, x, to_double(dy), gamma, ref, rdx, rdg, rdb);
    const auto cdx = compare(dx, rdx), cdg = compare(dgamma, rdg), cdb = compare(dbeta, rdb);
    INFO("dx: " << cdx.describe() << "; dgamma: " << cdg.describe() << "; dbeta: " << cdb.describe());
    CHECK(cdx.max_error < tol * 10);
    CHECK(cdg.max_error < tol);
    CHECK(cdb.max_error < 1e-6);
  }
}

TEST_CASE("batch norm backward matches finite differences of the forward", "[cpu][bn]") {
  CpuContext ctx(1);
  const std::int64_t rows = 6;
  const int c = 3;
  auto x = random_vector(rows * c, 20);
  auto gamma = random_vector(c, 21);
  auto beta = random_vector(c, 22);
  const auto g = random_vector(rows * c, 23);
  std::vector<float> y(rows * c), mean(c), invstd(c), dx(rows * c), dgamma(c), dbeta(c);
  auto loss = [&] {
    batch_norm_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                y.data(), mean.data(), invstd.data());
    return dot(g, y);
  };
  loss();
  batch_norm_backward(ctx, rows, c, x.data(), g.data(), gamma.data(), mean.data(), invstd.data(),
                      dx.data(), dgamma.data(), dbeta.data());
  const float h = 2e-3f;
  auto check_fd = [&](std::vector<float>& v, const std::vector<float>& grad, const char* name) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float keep = v[i];
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      const double fd = (up - down) / (2 * h);
      INFO(name << "[" << i << "] = " << grad[i] << ", finite difference " << fd);
      CHECK(std::abs(grad[i] - fd) < 5e-3 * (1 + std::abs(fd)));
    }
  };
  check_fd(x, dx, "dx");
  check_fd(gamma, dgamma, "dgamma");
  check_fd(beta, dbeta, "dbeta");
}

TEST_CASE("fused batch norm + ReLU (+ residual) equal the unfused composition", "[cpu][bn]") {
  CpuContext ctx(2);
  const std::int64_t rows = 1500;
  const int c = 21;
  const auto x = random_vector(rows * c, 30);
  const auto residual = random_vector(rows * c, 31);
  const auto gamma = random_vector(c, 32);
  const auto beta = random_vector(c, 33);
  const auto dy = random_vector(rows * c, 34);
  const float eps = 1e-3f;
  const auto ref = ref_forward(rows, c, x, gamma, beta, eps);

  for (bool add : {false, true}) {
    INFO((add ? "batch_norm_add_relu" : "batch_norm_relu"));
    std::vector<float> y(x.size(), NAN), mean(c), invstd(c);
    if (add)
      batch_norm_add_relu_forward_training(ctx, rows, c, x.data(), residual.data(), gamma.data(),
                                           beta.data(), eps, y.data(), mean.data(), invstd.data());
    else
      batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), eps,
                                       y.data(), mean.data(), invstd.data());
    std::vector<double> want(x.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = std::max(0.0, ref.y[i] + (add ? residual[i] : 0.0f));
    const auto cy = compare(y, want);
    INFO("forward: " << cy.describe());
    CHECK(cy.max_error < 1e-5);

    // Backward: the gradient masked by y > 0, then plain batch-norm backward.
    std::vector<double> masked(x.size());
    for (std::size_t i = 0; i < masked.size(); ++i) masked[i] = y[i] > 0.0f ? dy[i] : 0.0;
    std::vector<double> rdx, rdg, rdb;
    ref_backward(rows, c, x, masked, gamma, ref, rdx, rdg, rdb);
    std::vector<float> dx(x.size(), NAN), dgamma(c, NAN), dbeta(c, NAN), dpre(x.size(), NAN);
    batch_norm_relu_backward(ctx, rows, c, x.data(), y.data(), dy.data(), gamma.data(), nullptr,
                             mean.data(), invstd.data(), dx.data(), dgamma.data(), dbeta.data(),
                             dpre.data());
    const auto cdx = compare(dx, rdx), cdg = compare(dgamma, rdg), cdb = compare(dbeta, rdb);
    INFO("dx: " << cdx.describe() << "; dgamma: " << cdg.describe() << "; dbeta: " << cdb.describe());
    CHECK(cdx.max_error < 1e-4);
    CHECK(cdg.max_error < 1e-5);
    CHECK(cdb.max_error < 1e-6);
    CHECK(compare(dpre, masked).max_error == 0.0);

    // In place: d_pre_relu = dy, dx separate.
    std::vector<float> dy_inplace = dy, dx2(x.size());
    batch_norm_relu_backward(ctx, rows, c, x.data(), y.data(), dy_inplace.data(), gamma.data(),
                             nullptr, mean.data(), invstd.data(), dx2.data(), dgamma.data(),
                             dbeta.data(), dy_inplace.data());
    CHECK(dx2 == dx);
    CHECK(dy_inplace == dpre);
  }
}

// Two blocks of statistics rows and a partial third; the odd rows repeat row 0, so that a beta
// of row 0's opposite puts half the pre-ReLU values at the ReLU's edge.
namespace {
constexpr std::int64_t kEdgeRows = 2 * 512 + 37;
std::vector<float> odd_rows_repeat_row0(int c, std::uint32_t seed) {
  auto x = random_vector(static_cast<std::size_t>(kEdgeRows) * c, seed);
  for (std::int64_t r = 1; r < kEdgeRows; r += 2)
    for (int ch = 0; ch < c; ++ch) x[r * c + ch] = x[ch];
  return x;
}
}  // namespace

// Note [The ReLU mask from x] in core/cpu/batch_norm.cc: without y, the mask is recomputed from
// x; it must be the forward's own, so every result equals the one masked by the forward's y, bit
// for bit. Half of the pre-ReLU values are put within an ulp or so of zero, where an evaluation
// that rounded differently from the forward's would flip the mask: the odd rows repeat row 0,
// and beta is minus row 0's (x - mean) * scale rounded, so that the forward's FMA leaves that
// product's rounding error, of either sign or zero. Widths with and without a whole vector of
// channels, one and two threads.
TEST_CASE("batch norm + ReLU backward: the mask recomputed from x is the forward's", "[cpu][bn]") {
  for (int c : {16, 64, 13}) {
    for (int threads : {1, 2}) {
      INFO("c = " << c << ", threads = " << threads);
      CpuContext ctx(threads);
      const std::int64_t rows = kEdgeRows;
      const auto x = odd_rows_repeat_row0(c, 50 + c);
      const auto dy = random_vector(x.size(), 51);
      const auto gamma = random_vector(c, 52);
      std::vector<float> beta(c, 0.0f), y(x.size()), mean(c), invstd(c);
      // The statistics do not depend on beta.
      batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                       y.data(), mean.data(), invstd.data());
      for (int ch = 0; ch < c; ++ch) {
        const float scale = static_cast<float>(gamma[ch] * static_cast<double>(invstd[ch]));
        const volatile float product = (x[ch] - mean[ch]) * scale;  // rounded, not fused
        beta[ch] = -product;
      }
      batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                       y.data(), mean.data(), invstd.data());
      std::int64_t zeros = 0;
      for (float v : y) zeros += v == 0.0f;
      INFO(zeros << " of " << y.size() << " outputs zeroed by the ReLU");
      CHECK(zeros > static_cast<std::int64_t>(y.size()) / 4);

      std::vector<float> dx_y(x.size()), dg_y(c), db_y(c), dx_x(x.size(), NAN), dg_x(c, NAN), db_x(c, NAN);
      batch_norm_relu_backward(ctx, rows, c, x.data(), y.data(), dy.data(), gamma.data(), nullptr,
                               mean.data(), invstd.data(), dx_y.data(), dg_y.data(), db_y.data(), nullptr);
      batch_norm_relu_backward(ctx, rows, c, x.data(), nullptr, dy.data(), gamma.data(), beta.data(),
                               mean.data(), invstd.data(), dx_x.data(), dg_x.data(), db_x.data(), nullptr);
      CHECK(dx_x == dx_y);
      CHECK(dg_x == dg_y);
      CHECK(db_x == db_y);
      // And with the masked gradient stored too (the path the add variant takes).
      std::vector<float> pre(x.size(), NAN), dx_p(x.size());
      batch_norm_relu_backward(ctx, rows, c, x.data(), nullptr, dy.data(), gamma.data(), beta.data(),
                               mean.data(), invstd.data(), dx_p.data(), dg_x.data(), db_x.data(), pre.data());
      CHECK(dx_p == dx_y);
      for (std::size_t i = 0; i < pre.size(); ++i)
        if (pre[i] != (y[i] > 0.0f ? dy[i] : 0.0f)) {
          FAIL_CHECK("masked gradient " << i << ": " << pre[i] << " with y = " << y[i] << ", dy = " << dy[i]);
          break;
        }
    }
  }
  CpuContext ctx(1);
  float p[4] = {1, 1, 1, 1};
  CHECK_THROWS_WITH(batch_norm_relu_backward(ctx, 2, 2, p, nullptr, p, p, nullptr, p, p, p, p, p, nullptr),
                    Catch::Contains("y and beta are both null"));
}

namespace {

// Every bit of every output: the same floats must come out (a -0 against a +0 would fail too).
void same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
      FAIL_CHECK("value " << i << ": " << got[i] << " against the float kernel's " << want[i]);
      return;
    }
}

// v rounded to bf16 bits independently of the kernels: to nearest, ties to even, the largest
// finite floats carrying into infinity, a NaN kept quiet.
std::uint16_t round_bits(float v) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(v);
  if (std::isnan(v)) return static_cast<std::uint16_t>((b >> 16) | 0x40u);
  return static_cast<std::uint16_t>((std::uint64_t{b} + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

}  // namespace

// The bf16 output (Note [bf16 activations] in core/tensor/ops.cc) is the fp32 kernel's output
// rounded, each value checked against an independent rounding of its bits: to nearest, ties to
// even, a carry into the exponent, overflow to infinity. gamma spans 1e-3 to 3e38 so that some
// outputs are subnormal-small, some near the largest float and some infinite; the odd rows repeat
// row 0 and beta puts half the values at the ReLU's edge (as the test above does). Widths with
// and without a whole vector of channels, one and two threads.
TEST_CASE("batch norm + ReLU with a bf16 output: the fp32 output rounded, statistics unchanged",
          "[cpu][bn][bf16]") {
  for (int c : {16, 64, 13}) {
    for (int threads : {1, 2}) {
      INFO("c = " << c << ", threads = " << threads);
      CpuContext ctx(threads);
      const std::int64_t rows = kEdgeRows;
      const auto x = odd_rows_repeat_row0(c, 60 + c);
      auto gamma = random_vector(c, 61);
      auto beta = random_vector(c, 62);
      for (int ch = 0; ch < c; ++ch) {
        gamma[ch] = std::abs(gamma[ch]) * (ch % 4 == 1 ? 3e38f : ch % 4 == 2 ? 1e-3f : 1.0f);
        if (ch % 4 == 3) {  // y = beta exactly, a tie between two bf16 (odd, then even, below)
          gamma[ch] = 1e-30f;
          beta[ch] = std::bit_cast<float>(ch % 8 == 3 ? 0x3f818000u : 0x3f808000u);
        }
      }
      std::vector<float> y(x.size()), mean(c), invstd(c), mean_b(c, NAN), invstd_b(c, NAN);
      std::vector<std::uint16_t> yb(x.size(), 0xffff);
      batch_norm_relu_forward_training(ctx, rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                       y.data(), mean.data(), invstd.data());
      batch_norm_relu_forward_training_bf16(ctx, rows, c, x.data(), gamma.data(), beta.data(),
                                            1e-5f, yb.data(), mean_b.data(), invstd_b.data());
      CHECK(mean_b == mean);
      CHECK(invstd_b == invstd);
      std::int64_t infinite = 0, inexact = 0, ties = 0;
      for (std::size_t i = 0; i < y.size(); ++i) {
        infinite += std::isinf(y[i]);
        ties += (std::bit_cast<std::uint32_t>(y[i]) & 0x1ffffu) == 0x18000u;  // rounding up to even
        inexact += (std::bit_cast<std::uint32_t>(y[i]) & 0xffffu) != 0;
        if (yb[i] != round_bits(y[i])) {
          FAIL_CHECK("value " << i << ": fp32 " << y[i] << " gave bits " << yb[i] << ", want "
                              << round_bits(y[i]));
          break;
        }
      }
      INFO(infinite << " infinite, " << ties << " odd ties and " << inexact << " inexact values of "
                    << y.size());
      CHECK(infinite > 0);
      CHECK(ties > 0);
      CHECK(inexact > static_cast<std::int64_t>(y.size()) / 4);
    }
  }
}

TEST_CASE("batch norm with a bf16 input: the float kernels' results on the input widened, bit for bit",
          "[cpu][bn][bf16]") {
  for (int c : {16, 64, 13}) {  // whole vectors of channels (two register groups), and not
    for (int threads : {1, 2}) {
      INFO("c = " << c << ", threads = " << threads);
      CpuContext ctx(threads);
      const std::int64_t rows = kEdgeRows;
      const std::size_t n = static_cast<std::size_t>(rows) * c;
      // bf16 values (their low bits cut off the floats: the kernels read bits, not rounding),
      // with a mean far from zero in some channels, and the widened floats they stand for.
      auto x = random_vector(n, 70 + c);
      for (std::size_t i = 0; i < n; ++i)
        if (i % c % 3 == 1) x[i] = 50.0f + x[i];
      std::vector<std::uint16_t> xb(n);
      std::vector<float> xw(n);
      for (std::size_t i = 0; i < n; ++i) {
        xb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x[i]) >> 16);
        xw[i] = std::bit_cast<float>(std::uint32_t{xb[i]} << 16);
      }
      const auto gamma = random_vector(c, 71), beta = random_vector(c, 72);
      const auto residual = random_vector(n, 73), dy = random_vector(n, 74);
      const float eps = 1e-5f;
      std::vector<float> y(n), yw(n), mean(c), invstd(c), mean_w(c), invstd_w(c);

      batch_norm_forward_training_bf16_input(ctx, rows, c, xb.data(), gamma.data(), beta.data(), eps,
                                             y.data(), mean.data(), invstd.data());
      batch_norm_forward_training(ctx, rows, c, xw.data(), gamma.data(), beta.data(), eps, yw.data(),
                                  mean_w.data(), invstd_w.data());
      same_bits(y, yw, "batch_norm_forward_training: y");
      same_bits(mean, mean_w, "batch_norm_forward_training: mean");
      same_bits(invstd, invstd_w, "batch_norm_forward_training: invstd");
      // The statistics are right, not only the same: against the double reference.
      const RefForward ref = ref_forward(rows, c, xw, gamma, beta, eps);
      CHECK(compare(mean, ref.mean).max_error < 1e-5);
      CHECK(compare(y, ref.y).max_error < 1e-4);

      batch_norm_relu_forward_training_bf16_input(ctx, rows, c, xb.data(), gamma.data(), beta.data(),
                                                  eps, y.data(), mean.data(), invstd.data());
      batch_norm_relu_forward_training(ctx, rows, c, xw.data(), gamma.data(), beta.data(), eps,
                                       yw.data(), mean_w.data(), invstd_w.data());
      same_bits(y, yw, "batch_norm_relu_forward_training: y");
      same_bits(invstd, invstd_w, "batch_norm_relu_forward_training: invstd");

      std::vector<std::uint16_t> yb(n, 0xffff), ybw(n, 0);
      batch_norm_relu_forward_training_bf16_io(ctx, rows, c, xb.data(), gamma.data(), beta.data(),
                                               eps, yb.data(), mean.data(), invstd.data());
      batch_norm_relu_forward_training_bf16(ctx, rows, c, xw.data(), gamma.data(), beta.data(), eps,
                                            ybw.data(), mean_w.data(), invstd_w.data());
      CHECK(yb == ybw);
      same_bits(mean, mean_w, "batch_norm_relu_forward_training_bf16: mean");

      batch_norm_add_relu_forward_training_bf16_input(ctx, rows, c, xb.data(), residual.data(), nullptr,
                                                      gamma.data(), beta.data(), eps, y.data(), nullptr,
                                                      mean.data(), invstd.data());
      batch_norm_add_relu_forward_training(ctx, rows, c, xw.data(), residual.data(), gamma.data(),
                                           beta.data(), eps, yw.data(), mean_w.data(), invstd_w.data());
      same_bits(y, yw, "batch_norm_add_relu_forward_training: y");

      // The backwards, with the add variant's statistics and output (y) saved above.
      std::vector<float> dx(n), dxw(n), dg(c), dgw(c), db(c), dbw(c), dp(n), dpw(n);
      batch_norm_backward_bf16_input(ctx, rows, c, xb.data(), dy.data(), gamma.data(), mean.data(),
                                     invstd.data(), dx.data(), dg.data(), db.data());
      batch_norm_backward(ctx, rows, c, xw.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                          dxw.data(), dgw.data(), dbw.data());
      same_bits(dx, dxw, "batch_norm_backward: dx");
      same_bits(dg, dgw, "batch_norm_backward: dgamma");
      same_bits(db, dbw, "batch_norm_backward: dbeta");
      std::vector<double> rdx, rdg, rdb;
      const RefForward ref_add = ref_forward(rows, c, xw, gamma, beta, eps);
      ref_backward(rows, c, xw, to_double(dy), gamma, ref_add, rdx, rdg, rdb);
      CHECK(compare(dx, rdx).max_error < 1e-3);

      batch_norm_relu_backward_bf16_input(ctx, rows, c, xb.data(), y.data(), nullptr, dy.data(), gamma.data(),
                                          beta.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                                          db.data(), dp.data());
      batch_norm_relu_backward(ctx, rows, c, xw.data(), y.data(), dy.data(), gamma.data(), beta.data(),
                               mean.data(), invstd.data(), dxw.data(), dgw.data(), dbw.data(), dpw.data());
      same_bits(dx, dxw, "batch_norm_relu_backward (mask from y): dx");
      same_bits(dp, dpw, "batch_norm_relu_backward (mask from y): the residual's gradient");
      same_bits(dg, dgw, "batch_norm_relu_backward (mask from y): dgamma");

      // The mask recomputed from x, after the plain ReLU forward's statistics.
      batch_norm_relu_forward_training_bf16_input(ctx, rows, c, xb.data(), gamma.data(), beta.data(),
                                                  eps, y.data(), mean.data(), invstd.data());
      batch_norm_relu_backward_bf16_input(ctx, rows, c, xb.data(), nullptr, nullptr, dy.data(), gamma.data(),
                                          beta.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
                                          db.data(), nullptr);
      batch_norm_relu_backward(ctx, rows, c, xw.data(), nullptr, dy.data(), gamma.data(), beta.data(),
                               mean.data(), invstd.data(), dxw.data(), dgw.data(), dbw.data(), nullptr);
      same_bits(dx, dxw, "batch_norm_relu_backward (mask from x): dx");
      same_bits(db, dbw, "batch_norm_relu_backward (mask from x): dbeta");
    }
  }
}

// A ResNet block's output stored in bf16 for the next block (Note [bf16 block outputs] in
// core/tensor/ops.cc): the add variant with a bf16 residual and/or a bf16 output gives the float
// kernel's results on the widened values, the bf16 output that float output rounded (to nearest,
// ties to even, checked against an independent rounding of its bits), and the backward's mask
// read from the bf16 output gives what the float kernel gives with that output widened.
TEST_CASE("batch norm + residual + ReLU with bf16 residuals and outputs: the float kernel's results rounded",
          "[cpu][bn][bf16]") {
  auto widen = [](std::uint16_t b) { return std::bit_cast<float>(std::uint32_t{b} << 16); };
  auto cut = [](float v) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16); };
  for (int c : {16, 64, 13}) {  // whole vectors of channels, and not
    for (int threads : {1, 2}) {
      INFO("c = " << c << ", threads = " << threads);
      CpuContext ctx(threads);
      const std::int64_t rows = kEdgeRows;
      const std::size_t n = static_cast<std::size_t>(rows) * c;
      const auto x = random_vector(n, 80 + c), r = random_vector(n, 81 + c), dy = random_vector(n, 82);
      const auto gamma = random_vector(c, 83), beta = random_vector(c, 84);
      std::vector<std::uint16_t> xb(n), rb(n);
      std::vector<float> xw(n), rw(n);
      for (std::size_t i = 0; i < n; ++i) {
        xb[i] = cut(x[i]);
        rb[i] = cut(r[i]);
        xw[i] = widen(xb[i]);
        rw[i] = widen(rb[i]);
      }
      const float eps = 1e-5f;
      std::vector<float> yw(n), mean_w(c), invstd_w(c), y(n), mean(c), invstd(c);
      batch_norm_add_relu_forward_training(ctx, rows, c, xw.data(), rw.data(), gamma.data(), beta.data(), eps,
                                           yw.data(), mean_w.data(), invstd_w.data());

      // A bf16 residual, a float output.
      batch_norm_add_relu_forward_training_bf16_input(ctx, rows, c, xb.data(), nullptr, rb.data(), gamma.data(),
                                                      beta.data(), eps, y.data(), nullptr, mean.data(),
                                                      invstd.data());
      same_bits(y, yw, "bf16 residual: y");
      same_bits(mean, mean_w, "bf16 residual: mean");
      same_bits(invstd, invstd_w, "bf16 residual: invstd");

      // bf16 outputs, from a bf16 and from a float residual.
      std::int64_t inexact = 0, zeros = 0;
      for (std::size_t i = 0; i < n; ++i) {
        inexact += (std::bit_cast<std::uint32_t>(yw[i]) & 0xffffu) != 0;
        zeros += yw[i] == 0.0f;
      }
      CHECK(inexact > static_cast<std::int64_t>(n) / 4);  // the rounding is exercised
      CHECK(zeros > static_cast<std::int64_t>(n) / 8);    // and so is the ReLU
      for (const bool bf16_residual : {true, false}) {
        INFO((bf16_residual ? "bf16 residual" : "float residual"));
        std::vector<std::uint16_t> yb(n, 0xffff);
        batch_norm_add_relu_forward_training_bf16_input(
            ctx, rows, c, xb.data(), bf16_residual ? nullptr : rw.data(), bf16_residual ? rb.data() : nullptr,
            gamma.data(), beta.data(), eps, nullptr, yb.data(), mean.data(), invstd.data());
        same_bits(mean, mean_w, "bf16 output: mean");
        for (std::size_t i = 0; i < n; ++i)
          if (yb[i] != round_bits(yw[i])) {
            FAIL_CHECK("value " << i << ": fp32 " << yw[i] << " gave bits " << yb[i] << ", want "
                                << round_bits(yw[i]));
            break;
          }
      }

      // The backward, its ReLU mask from the bf16 output: the float kernel's with that output
      // widened, and the residual's gradient dy where the stored output is positive, else 0.
      std::vector<std::uint16_t> yb(n);
      for (std::size_t i = 0; i < n; ++i) yb[i] = round_bits(yw[i]);
      std::vector<float> ybw(n);
      for (std::size_t i = 0; i < n; ++i) ybw[i] = widen(yb[i]);
      std::vector<float> dx(n), dxw(n), dg(c), dgw(c), db(c), dbw(c), dp(n), dpw(n);
      batch_norm_relu_backward_bf16_input(ctx, rows, c, xb.data(), nullptr, yb.data(), dy.data(), gamma.data(),
                                          beta.data(), mean_w.data(), invstd_w.data(), dx.data(), dg.data(),
                                          db.data(), dp.data());
      batch_norm_relu_backward(ctx, rows, c, xw.data(), ybw.data(), dy.data(), gamma.data(), beta.data(),
                               mean_w.data(), invstd_w.data(), dxw.data(), dgw.data(), dbw.data(), dpw.data());
      same_bits(dx, dxw, "mask from the bf16 output: dx");
      same_bits(dg, dgw, "mask from the bf16 output: dgamma");
      same_bits(db, dbw, "mask from the bf16 output: dbeta");
      same_bits(dp, dpw, "mask from the bf16 output: the residual's gradient");
      for (std::size_t i = 0; i < n; ++i)
        if (dp[i] != (ybw[i] > 0.0f ? dy[i] : 0.0f)) {
          FAIL_CHECK("value " << i << ": the residual's gradient " << dp[i] << " for output " << ybw[i]
                              << " and dy " << dy[i]);
          break;
        }
    }
  }
  CpuContext ctx(1);
  float p[4] = {1, 1, 1, 1};
  std::uint16_t b[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  CHECK_THROWS_WITH(batch_norm_add_relu_forward_training_bf16_input(ctx, 2, 2, b, p, b, p, p, 1e-5f, p, nullptr,
                                                                    p, p),
                    Catch::Contains("one residual"));
  CHECK_THROWS_WITH(batch_norm_relu_backward_bf16_input(ctx, 2, 2, b, p, b, p, p, p, p, p, p, p, p, nullptr),
                    Catch::Contains("both as floats and as bf16"));
}

TEST_CASE("batch norm inference uses the running statistics", "[cpu][bn]") {
  CpuContext ctx(2);
  const std::int64_t rows = 33;
  const int c = GENERATE(9, 16);  // scalar and vector loops
  INFO("c = " << c);
  const auto x = random_vector(rows * c, 40);
  const auto gamma = random_vector(c, 41);
  const auto beta = random_vector(c, 42);
  const auto rmean = random_vector(c, 43);
  auto rvar = random_vector(c, 44);
  for (auto& v : rvar) v = v * v + 0.1f;
  std::vector<float> y(x.size(), NAN);
  batch_norm_forward_inference(ctx, rows, c, x.data(), gamma.data(), beta.data(), rmean.data(),
                               rvar.data(), 1e-5f, y.data());
  std::vector<double> want(x.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const int ch = int(i % c);
    want[i] = (x[i] - double(rmean[ch])) / std::sqrt(double(rvar[ch]) + 1e-5) * gamma[ch] + beta[ch];
  }
  const auto cy = compare(y, want);
  INFO(cy.describe());
  CHECK(cy.max_error < 1e-6);
}

TEST_CASE("batch norm results are identical for 1 and 3 threads", "[cpu][bn]") {
  CpuContext one(1), three(3);
  const std::int64_t rows = 40000;
  const int c = 16;
  const auto x = random_vector(rows * c, 50);
  const auto gamma = random_vector(c, 51);
  const auto beta = random_vector(c, 52);
  const auto dy = random_vector(rows * c, 53);
  std::vector<float> out[2][6];
  const CpuContext* ctxs[2] = {&one, &three};
  for (int t = 0; t < 2; ++t) {
    auto& o = out[t];
    o[0].resize(x.size()); o[1].resize(c); o[2].resize(c);
    o[3].resize(x.size()); o[4].resize(c); o[5].resize(c);
    batch_norm_forward_training(*ctxs[t], rows, c, x.data(), gamma.data(), beta.data(), 1e-5f,
                                o[0].data(), o[1].data(), o[2].data());
    batch_norm_backward(*ctxs[t], rows, c, x.data(), dy.data(), gamma.data(), o[1].data(),
                        o[2].data(), o[3].data(), o[4].data(), o[5].data());
  }
  for (int k = 0; k < 6; ++k) CHECK(out[0][k] == out[1][k]);
}

TEST_CASE("batch norm rejects bad arguments with the value named", "[cpu][bn]") {
  CpuContext ctx(1);
  std::vector<float> buf(64, 1.0f);
  float* p = buf.data();
  CHECK_THROWS_WITH(batch_norm_forward_training(ctx, 0, 4, p, p, p, 1e-5f, p, p, p),
                    Catch::Contains("rows = 0"));
  CHECK_THROWS_AS(batch_norm_forward_training(ctx, 0, 4, p, p, p, 1e-5f, p, p, p),
                  towerflow::InvalidArgument);
  CHECK_THROWS_WITH(batch_norm_backward(ctx, 4, 0, p, p, p, p, p, p, p, p),
                    Catch::Contains("channels c = 0"));
  CHECK_THROWS_WITH(batch_norm_relu_forward_training(ctx, 4, 4, p, p, p, -1.0f, p, p, p),
                    Catch::Contains("eps = -1"));
  std::vector<float> var = {1.0f, -2.0f};
  CHECK_THROWS_WITH(batch_norm_forward_inference(ctx, 4, 2, p, p, p, p, var.data(), 1e-5f, p),
                    Catch::Contains("running_var[1]"));
}

TEST_CASE("batch norm phases over two slices combine into the whole batch's forward and backward",
          "[cpu][bn][sync]") {
  // What synchronised batch norm does across towers, on one thread: moments per slice, merged
  // with row weights; the apply and reduce phases per slice with the merged statistics.
  CpuContext ctx(2);
  const std::int64_t rows = 1500, split = 1100;  // 11:4
  const int c = GENERATE(21, 32);  // scalar and vector loops
  INFO("c = " << c);
  auto x = random_vector(rows * c, 40);
  for (float& v : x) v += 30.0f;  // a large mean: the merge must not cancel
  const auto residual = random_vector(rows * c, 41);
  const auto gamma = random_vector(c, 42);
  const auto beta = random_vector(c, 43);
  const auto dy = random_vector(rows * c, 44);
  const float eps = 1e-3f;
  const auto ref = ref_forward(rows, c, x, gamma, beta, eps);
  const std::int64_t part_rows[2] = {split, rows - split};
  const std::int64_t first[2] = {0, split};

  // Moments, merged (Chan): the whole batch's mean and biased variance.
  std::vector<double> mean(c, 0.0), m2(c, 0.0);
  double count = 0;
  for (int p = 0; p < 2; ++p) {
    std::vector<double> pm(c), pm2(c);
    batch_norm_moments(ctx, part_rows[p], c, x.data() + first[p] * c, pm.data(), pm2.data());
    const double n = static_cast<double>(part_rows[p]), total = count + n;
    for (int ch = 0; ch < c; ++ch) {
      const double delta = pm[ch] - mean[ch];
      mean[ch] += delta * n / total;
      m2[ch] += pm2[ch] + delta * delta * count * n / total;
    }
    count = total;
  }
  std::vector<float> mean_f(c), invstd_f(c);
  std::vector<double> invstd(c);
  for (int ch = 0; ch < c; ++ch) {
    invstd[ch] = 1.0 / std::sqrt(m2[ch] / count + eps);
    mean_f[ch] = static_cast<float>(mean[ch]);
    invstd_f[ch] = static_cast<float>(invstd[ch]);
  }
  const auto cm = compare(mean, ref.mean), ci = compare(invstd, ref.invstd);
  INFO("merged mean: " << cm.describe() << "; invstd: " << ci.describe());
  CHECK(cm.max_error < 1e-6);  // float sums within blocks of rows, as the fused kernels
  CHECK(ci.max_error < 1e-5);

  for (int variant = 0; variant < 3; ++variant) {  // plain, relu, add + relu
    const bool relu = variant > 0, add = variant == 2;
    INFO("variant " << variant);
    std::vector<float> y(x.size(), NAN);
    for (int p = 0; p < 2; ++p)
      batch_norm_forward_apply(ctx, part_rows[p], c, x.data() + first[p] * c,
                               add ? residual.data() + first[p] * c : nullptr, relu, gamma.data(),
                               beta.data(), mean_f.data(), invstd_f.data(), y.data() + first[p] * c);
    std::vector<double> want(x.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double v = ref.y[i] + (add ? residual[i] : 0.0f);
      want[i] = relu ? std::max(0.0, v) : v;
    }
    const auto cy = compare(y, want);
    INFO("forward: " << cy.describe());
    CHECK(cy.max_error < 1e-5);

    std::vector<double> g(x.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = !relu || y[i] > 0.0f ? dy[i] : 0.0;
    std::vector<double> rdx, rdg, rdb;
    ref_backward(rows, c, x, g, gamma, ref, rdx, rdg, rdb);
    std::vector<double> sum_g(c, 0.0), sum_gxc(c, 0.0);
    std::vector<float> dpre(x.size(), NAN);
    for (int p = 0; p < 2; ++p) {
      std::vector<double> sg(c), sgx(c);
      batch_norm_backward_reduce(ctx, part_rows[p], c, x.data() + first[p] * c,
                                 relu ? y.data() + first[p] * c : nullptr, dy.data() + first[p] * c,
                                 mean_f.data(), sg.data(), sgx.data(),
                                 relu ? dpre.data() + first[p] * c : nullptr);
      for (int ch = 0; ch < c; ++ch) {
        sum_g[ch] += sg[ch];
        sum_gxc[ch] += sgx[ch];
      }
    }
    std::vector<double> dgamma(c);
    std::vector<float> mean_g(c), mean_gxhat(c);
    for (int ch = 0; ch < c; ++ch) {
      dgamma[ch] = sum_gxc[ch] * invstd[ch];
      mean_g[ch] = static_cast<float>(sum_g[ch] / count);
      mean_gxhat[ch] = static_cast<float>(dgamma[ch] / count);
    }
    std::vector<float> dx(x.size(), NAN);
    for (int p = 0; p < 2; ++p)
      batch_norm_backward_apply(ctx, part_rows[p], c, x.data() + first[p] * c,
                                relu ? y.data() + first[p] * c : nullptr, dy.data() + first[p] * c,
                                gamma.data(), mean_f.data(), invstd_f.data(), mean_g.data(),
                                mean_gxhat.data(), dx.data() + first[p] * c);
    const auto cdx = compare(dx, rdx), cdg = compare(dgamma, rdg), cdb = compare(sum_g, rdb);
    INFO("dx: " << cdx.describe() << "; dgamma: " << cdg.describe() << "; dbeta: " << cdb.describe());
    CHECK(cdx.max_error < 1e-4);
    CHECK(cdg.max_error < 1e-5);
    CHECK(cdb.max_error < 1e-6);
    if (relu) CHECK(compare(dpre, g).max_error == 0.0);
  }
}
