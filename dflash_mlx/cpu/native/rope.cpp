// rope: rotary embeddings of (B, L, H, D) queries or keys with a per-forward
// table, written as the (B, H, L, D) heads attention reads: one op where the
// compiled one is four (two slices, a concatenation, the rotation) and a transpose.
// The table is (L, 1, D), or (B, L, 1, D) when the rows of a batch sit at
// different positions.
#include "ops.h"
#include "simd.h"

namespace dflash {

mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin) {
  const bool per_row = cos.ndim() == 4;
  if (x.ndim() != 4 || (cos.ndim() != 3 && !per_row) || cos.shape() != sin.shape() ||
      (per_row && cos.shape(0) != x.shape(0)) ||
      cos.shape(-3) != x.shape(1) || cos.shape(-1) != x.shape(3) ||
      x.shape(3) % 2 != 0) {
    throw std::invalid_argument(
        "rope: x (B, L, H, D) and cos, sin tables (L, 1, D) or (B, L, 1, D), D even");
  }
  auto run = [per_row](const std::vector<mx::array>& in, mx::array& out) {
    std::vector<float> xs, cs, ss;
    const float* x = dense(in[0], xs);
    const float* c = dense(in[1], cs);
    const float* s = dense(in[2], ss);
    const int B = in[0].shape(0), L = in[0].shape(1), H = in[0].shape(2);
    const int D = in[0].shape(3), half = D / 2;
    float* y = out.data<float>();
    for (int b = 0; b < B; b++)
      for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
          const float* xr = x + (((size_t)b * L + l) * H + h) * D;
          const size_t at = ((per_row ? (size_t)b * L : 0) + l) * D;
          const float* cr = c + at;
          const float* sr = s + at;
          float* yr = y + (((size_t)b * H + h) * L + l) * D;
          // y = x * cos + rotate_half(x) * sin, sin's first half already negated
          for (int d = 0; d < D; d++) {
            yr[d] = xr[d] * cr[d] + xr[d < half ? d + half : d - half] * sr[d];
          }
        }
  };
  mx::Shape shape{x.shape(0), x.shape(2), x.shape(1), x.shape(3)};
  return kernel_output("Rope", shape, run, {x, cos, sin}, {}, 3);
}

}  // namespace dflash
