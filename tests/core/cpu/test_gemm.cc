#include <catch2/catch.hpp>

#include "core/cpu/gemm.h"
#include "core/cpu/kernel_test_util.h"
#include "core/error.h"

using namespace towerflow::cpu;
using namespace towerflow::cpu::testing;

namespace {

struct GemmCase {
  bool ta, tb;
  int m, n, k;
  float alpha, beta;
  int pad;  // extra floats per row in every leading dimension
};

// c = alpha * op(a) op(b) + beta * c, element by element in double.
std::vector<double> ref_gemm(const GemmCase& g, const std::vector<float>& a, int lda,
                             const std::vector<float>& b, int ldb, const std::vector<float>& c,
                             int ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0.0;
      for (int p = 0; p < g.k; ++p) {
        const double av = g.ta ? a[std::size_t(p) * lda + i] : a[std::size_t(i) * lda + p];
        const double bv = g.tb ? b[std::size_t(j) * ldb + p] : b[std::size_t(p) * ldb + j];
        s += av * bv;
      }
      const double prev = g.beta == 0.0f ? 0.0 : g.beta * double(c[std::size_t(i) * ldc + j]);
      out[std::size_t(i) * ldc + j] = g.alpha * s + prev;
    }
  return out;
}

}  // namespace

TEST_CASE("gemm matches the reference for every transpose, odd sizes and strides", "[cpu][gemm]") {
  CpuContext ctx(2);
  std::uint32_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (GemmCase g : {GemmCase{ta, tb, 1, 1, 1, 1.0f, 0.0f, 0}, GemmCase{ta, tb, 7, 13, 5, 0.5f, 0.0f, 3},
                         GemmCase{ta, tb, 130, 67, 301, 1.0f, 1.0f, 1},
                         GemmCase{ta, tb, 33, 200, 64, -2.0f, 0.25f, 0},
                         GemmCase{ta, tb, 5, 6, 0, 1.0f, 0.5f, 2}}) {
        INFO("ta " << ta << " tb " << tb << " m " << g.m << " n " << g.n << " k " << g.k
                   << " alpha " << g.alpha << " beta " << g.beta << " pad " << g.pad);
        const int lda = (ta ? g.m : g.k) + g.pad, ldb = (tb ? g.k : g.n) + g.pad, ldc = g.n + g.pad;
        const auto a = random_vector(std::size_t(ta ? g.k : g.m) * lda, seed++);
        const auto b = random_vector(std::size_t(tb ? g.n : g.k) * ldb, seed++);
        auto c = random_vector(std::size_t(g.m) * ldc, seed++);
        if (g.beta == 0.0f) std::fill(c.begin(), c.end(), NAN);  // must not be read
        const auto want = ref_gemm(g, a, lda, b, ldb, c, ldc);
        gemm(ctx, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, c.data(), ldc);
        // Padding columns of c stay untouched (NaN where c started as NaN).
        std::vector<float> got_valid;
        std::vector<double> want_valid;
        for (int i = 0; i < g.m; ++i)
          for (int j = 0; j < g.n; ++j) {
            got_valid.push_back(c[std::size_t(i) * ldc + j]);
            want_valid.push_back(want[std::size_t(i) * ldc + j]);
          }
        const auto cmp = compare(got_valid, want_valid);
        INFO(cmp.describe());
        CHECK(cmp.max_error < 1e-5);
        for (int i = 0; i < g.m; ++i)
          for (int j = g.n; j < ldc; ++j)
            CHECK(std::isnan(c[std::size_t(i) * ldc + j]) == (g.beta == 0.0f));
      }
}

TEST_CASE("gemm results are identical for 1 and 3 threads", "[cpu][gemm]") {
  CpuContext one(1), three(3);
  for (auto [m, n, k] : {std::tuple{300, 70, 200}, std::tuple{40, 500, 300}, std::tuple{129, 385, 257}}) {
    INFO("m " << m << " n " << n << " k " << k);
    const auto a = random_vector(std::size_t(m) * k, 7);
    const auto b = random_vector(std::size_t(k) * n, 8);
    std::vector<float> c1(std::size_t(m) * n), c3(std::size_t(m) * n);
    gemm(one, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c1.data(), n);
    gemm(three, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c3.data(), n);
    CHECK(c1 == c3);
  }
}

TEST_CASE("gemm rejects negative sizes and short leading dimensions", "[cpu][gemm]") {
  CpuContext ctx(1);
  std::vector<float> buf(64);
  float* p = buf.data();
  CHECK_THROWS_WITH(gemm(ctx, false, false, -1, 2, 2, 1.0f, p, 2, p, 2, 0.0f, p, 2),
                    Catch::Contains("m = -1"));
  CHECK_THROWS_AS(gemm(ctx, false, false, -1, 2, 2, 1.0f, p, 2, p, 2, 0.0f, p, 2),
                  towerflow::InvalidArgument);
  CHECK_THROWS_WITH(gemm(ctx, false, false, 2, 3, 4, 1.0f, p, 3, p, 3, 0.0f, p, 3),
                    Catch::Contains("lda = 3"));
  CHECK_THROWS_WITH(gemm(ctx, false, true, 2, 3, 4, 1.0f, p, 4, p, 3, 0.0f, p, 3),
                    Catch::Contains("ldb = 3"));
  CHECK_THROWS_WITH(gemm(ctx, true, false, 2, 3, 4, 1.0f, p, 2, p, 3, 0.0f, p, 2),
                    Catch::Contains("ldc = 2"));
}
