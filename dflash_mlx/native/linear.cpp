// small_linear and gated_linear: a few rows of x times a weight, each group of
// output rows streaming its weight rows once against every row of x (in L1).
#include <algorithm>

#include "ops.h"
#include "simd.h"
#include "workers.h"

namespace dflash {
namespace {

constexpr int MAX_CHUNK = 8;  // rows of x multiplied per pass over a group of w rows
constexpr size_t PARALLEL_BYTES = 1 << 17;  // smaller weights run on one thread

// y[t * ldy + o] for o in [o0, o1), t < T, in groups of R output rows. Each
// element is LANES partial sums over `in` in order, their tree sum, then the tail.
template <int T, int R>
void rows_fixed(const float* w, const float* x, float* y, int o0, int o1, int ldy,
                int in) {
  const int body = in - in % LANES;
  int o = o0;
  for (; o + R <= o1; o += R) {
    vec acc[R][T];
    for (int r = 0; r < R; r++)
      for (int t = 0; t < T; t++) acc[r][t] = vec{};
    for (int i = 0; i < body; i += LANES) {
      vec xs[T];
      for (int t = 0; t < T; t++) xs[t] = load(x + (size_t)t * in + i);
      for (int r = 0; r < R; r++) {
        vec wr = load(w + (size_t)(o + r) * in + i);
        for (int t = 0; t < T; t++) acc[r][t] += wr * xs[t];
      }
    }
    for (int r = 0; r < R; r++) {
      const float* wr = w + (size_t)(o + r) * in;
      for (int t = 0; t < T; t++) {
        float tail = 0.0f;
        for (int i = body; i < in; i++) tail += wr[i] * x[(size_t)t * in + i];
        y[(size_t)t * ldy + o + r] = lane_sum(acc[r][t]) + tail;
      }
    }
  }
  if constexpr (R > 1) {
    if (o < o1) rows_fixed<T, 1>(w, x, y, o, o1, ldy, in);
  }
}

// More rows of w per group where x has few rows: more sums in registers per load.
template <int T>
void rows_t(const float* w, const float* x, float* y, int o0, int o1, int ldy,
            int in) {
  constexpr int R = T <= 2 ? 4 : (T <= 4 ? 3 : 2);
  rows_fixed<T, R>(w, x, y, o0, o1, ldy, in);
}

using RowsFn = void (*)(const float*, const float*, float*, int, int, int, int);
constexpr RowsFn ROWS[MAX_CHUNK + 1] = {
    nullptr,   rows_t<1>, rows_t<2>, rows_t<3>, rows_t<4>,
    rows_t<5>, rows_t<6>, rows_t<7>, rows_t<8>};

// Output rows [o0, o1) for all `tokens` rows of x, MAX_CHUNK of them at a time.
void product_rows(const float* w, const float* x, float* y, int o0, int o1,
                  int ldy, int in, int tokens) {
  for (int t0 = 0; t0 < tokens; t0 += MAX_CHUNK) {
    int n = std::min(MAX_CHUNK, tokens - t0);
    ROWS[n](w, x + (size_t)t0 * in, y + (size_t)t0 * ldy, o0, o1, ldy, in);
  }
}

// Runs job(o0, o1) over the output rows on every core when the weights are big.
void over_rows(int out, int in, int weights,
               const std::function<void(int, int)>& job) {
  size_t bytes = (size_t)weights * out * in * sizeof(float);
  Workers::get().split(out, 4, bytes >= PARALLEL_BYTES, job);
}

mx::Shape out_shape(const mx::array& x, const mx::array& w) {
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1)) {
    throw std::invalid_argument("x (..., in) and w (out, in)");
  }
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return shape;
}

}  // namespace

mx::array small_linear(const mx::array& x, const mx::array& w) {
  auto run = [](const std::vector<mx::array>& in, mx::array& out) {
    std::vector<float> xs, ws;
    const float* x = dense(in[0], xs);
    const float* w = dense(in[1], ws);
    int rows = in[1].shape(0), n = in[1].shape(1);
    int tokens = n ? (int)(in[0].size() / n) : 0;
    float* y = out.data<float>();
    over_rows(rows, n, 1, [&](int o0, int o1) {
      product_rows(w, x, y, o0, o1, rows, n, tokens);
    });
  };
  return kernel_output("SmallLinear", out_shape(x, w), run, {x, w});
}

mx::array gated_linear(const mx::array& x, const mx::array& gate,
                       const mx::array& up) {
  auto shape = out_shape(x, gate);
  if (up.shape() != gate.shape()) {
    throw std::invalid_argument("gate and up weights of one shape");
  }
  auto run = [](const std::vector<mx::array>& in, mx::array& out) {
    std::vector<float> xs, gs, us;
    const float* x = dense(in[0], xs);
    const float* g = dense(in[1], gs);
    const float* u = dense(in[2], us);
    int rows = in[1].shape(0), n = in[1].shape(1);
    int tokens = n ? (int)(in[0].size() / n) : 0;
    float* y = out.data<float>();
    over_rows(rows, n, 2, [&](int o0, int o1) {
      // this part's gate and up products (as small_linear's), then
      // silu(gate) * up = gate * up / (1 + exp(-gate))
      const int width = o1 - o0;
      std::vector<float> gates((size_t)tokens * width), ups(gates.size());
      product_rows(g + (size_t)o0 * n, x, gates.data(), 0, width, width, n, tokens);
      product_rows(u + (size_t)o0 * n, x, ups.data(), 0, width, width, n, tokens);
      for (int t = 0; t < tokens; t++) {
        const float* gt = &gates[(size_t)t * width];
        const float* ut = &ups[(size_t)t * width];
        float* yt = y + (size_t)t * rows + o0;
        int o = 0;
        for (; o + LANES <= width; o += LANES) {
          vec gv = load(gt + o);
          store(yt + o, gv * load(ut + o) / (1.0f + vexp(-gv)));
        }
        for (; o < width; o++) {
          vec gv = vec{} + gt[o];
          yt[o] = (gv * ut[o] / (1.0f + vexp(-gv)))[0];
        }
      }
    });
  };
  return kernel_output("GatedLinear", shape, run, {x, gate, up});
}

}  // namespace dflash
