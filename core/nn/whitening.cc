#include "core/nn/whitening.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace towerflow::nn {

Whitening patch_whitening(const Tensor& images, WhiteningOptions options) {
  if (images.ndim() != 4)
    raise<InvalidArgument>("patch_whitening: images of shape ", shape_str(images.shape()),
                           "; expected NHWC [n, h, w, c]");
  const std::int64_t n = images.dim(0), h = images.dim(1), w = images.dim(2), c = images.dim(3);
  const int k = options.kernel;
  if (k < 1 || k > h || k > w)
    raise<InvalidArgument>("patch_whitening: kernel ", k, " must be between 1 and the image's side (",
                           h, "x", w, ")");
  if (!(options.eps > 0.0))
    raise<InvalidArgument>("patch_whitening: eps ", options.eps, " must be > 0");
  const std::int64_t dim = c * k * k;
  const std::int64_t patches = n * (h - k + 1) * (w - k + 1);
  if (patches < dim)
    raise<InvalidArgument>("patch_whitening: ", patches, " patches of ", dim,
                           " values cannot give a full-rank covariance; pass more images");

  const std::vector<float> x = images.to_host();
  Eigen::MatrixXd cov = Eigen::MatrixXd::Zero(dim, dim);
  Eigen::VectorXd p(dim);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t y0 = 0; y0 + k <= h; ++y0)
      for (std::int64_t x0 = 0; x0 + k <= w; ++x0) {
        for (std::int64_t ch = 0; ch < c; ++ch)
          for (int dy = 0; dy < k; ++dy)
            for (int dx = 0; dx < k; ++dx)
              p[(ch * k + dy) * k + dx] = x[static_cast<std::size_t>(((i * h + y0 + dy) * w + x0 + dx) * c + ch)];
        cov.selfadjointView<Eigen::Lower>().rankUpdate(p);
      }
  cov = cov.selfadjointView<Eigen::Lower>();
  cov /= static_cast<double>(patches);

  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(cov);
  if (solver.info() != Eigen::Success)
    raise<InvalidArgument>("patch_whitening: the patch covariance's eigen-decomposition failed");
  Whitening out;
  std::vector<float> weight(static_cast<std::size_t>(2 * dim * dim));
  for (std::int64_t f = 0; f < dim; ++f) {
    const std::int64_t col = dim - 1 - f;  // Eigen's eigenvalues increase
    const double value = solver.eigenvalues()[col];
    out.eigenvalues.push_back(value);
    Eigen::VectorXd v = solver.eigenvectors().col(col);
    Eigen::Index largest = 0;
    v.cwiseAbs().maxCoeff(&largest);
    if (v[largest] < 0) v = -v;
    v /= std::sqrt(value + options.eps);
    for (std::int64_t j = 0; j < dim; ++j) {
      weight[static_cast<std::size_t>(f * dim + j)] = static_cast<float>(v[j]);
      weight[static_cast<std::size_t>((f + dim) * dim + j)] = static_cast<float>(-v[j]);
    }
  }
  out.weight = Tensor::from_host(std::span<const float>(weight), {2 * dim, c, k, k}, Device::cpu());
  return out;
}

}  // namespace towerflow::nn
