// rms_norm: x / sqrt(mean(x^2) + eps) * weight, a row at a time, as one op where
// MLX's CPU path is eight (square, sum, rsqrt, broadcasts, products).
#include <cmath>

#include "ops.h"
#include "simd.h"

namespace dflash {

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps) {
  if (weight.ndim() != 1 || x.ndim() < 1 || x.shape(-1) != weight.shape(0)) {
    throw std::invalid_argument("rms_norm: x (..., n) and weight (n,)");
  }
  auto run = [eps](const std::vector<mx::array>& in, mx::array& out) {
    std::vector<float> xs, ws;
    const float* x = dense(in[0], xs);
    const float* w = dense(in[1], ws);
    const int n = in[1].shape(0);
    const size_t rows = n ? in[0].size() / n : 0;
    float* y = out.data<float>();
    for (size_t r = 0; r < rows; r++) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      const float scale = 1.0f / std::sqrt(sum_of_squares(xr, n) / n + eps);
      int i = 0;
      for (; i + LANES <= n; i += LANES) store(yr + i, load(xr + i) * scale * load(w + i));
      for (; i < n; i++) yr[i] = xr[i] * scale * w[i];
    }
  };
  return kernel_output("RMSNorm", x.shape(), run, {x, weight}, {eps});
}

}  // namespace dflash
