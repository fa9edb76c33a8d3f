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
// Weights ahead of the loads, in elements, prefetched where x has 2+ rows: the
// weights stream from memory and more arithmetic per weight left fewer loads in
// flight (block 8 at 31-32 tok/s without, 36-38 with; a plain step, one row, lost
// ~5% to the extra instructions, so it has none; Intel Xeon, AVX-512). 1024, not
// 256: the default target's 30 layers and head (float32, 470 MB) at 8 rows took
// 39-50 ms with 256, 29-37 with 1024 (medians of 30, 7 runs each, alternated), 4
// rows 29-38 -> 26-33 ms, 32 rows 111-135 -> 94-96 ms; 2048 was no better.
constexpr int PREFETCH = 1024;

template <Weights W>
inline void prefetch_weights(const void* w, size_t i) {
  constexpr size_t bytes = W == Weights::f32 ? 4 : 2;
  __builtin_prefetch(static_cast<const char*>(w) + i * bytes, 0, 3);
}

// y[t * ldy + o] for o in [o0, o1), t < T, in groups of R output rows of the
// weights w (in, W-typed). Each element is LANES partial sums over `in` in order,
// their tree sum, then the tail.
template <Weights W, int T, int R>
void rows_fixed(const void* w, const float* x, float* y, int o0, int o1, int ldy,
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
        const size_t at = (size_t)(o + r) * in + i;
        if constexpr (T > 1) prefetch_weights<W>(w, at + PREFETCH);
        vec wr = load_weights<W>(w, at);
        for (int t = 0; t < T; t++) acc[r][t] = fma(wr, xs[t], acc[r][t]);
      }
    }
    for (int r = 0; r < R; r++) {
      const size_t row = (size_t)(o + r) * in;
      for (int t = 0; t < T; t++) {
        float tail = 0.0f;
        for (int i = body; i < in; i++)
          tail += weight_at<W>(w, row + i) * x[(size_t)t * in + i];
        y[(size_t)t * ldy + o + r] = lane_sum(acc[r][t]) + tail;
      }
    }
  }
  if constexpr (R > 1) {
    if (o < o1) rows_fixed<W, T, 1>(w, x, y, o, o1, ldy, in);
  }
}

// More rows of w per group where x has few rows: more sums in registers per load.
template <Weights W, int T>
void rows_t(const void* w, const float* x, float* y, int o0, int o1, int ldy,
            int in) {
  constexpr int R = T <= 2 ? 4 : (T <= 4 ? 3 : 2);
  rows_fixed<W, T, R>(w, x, y, o0, o1, ldy, in);
}

using RowsFn = void (*)(const void*, const float*, float*, int, int, int, int);

template <Weights W>
constexpr RowsFn ROWS[MAX_CHUNK + 1] = {
    nullptr,         rows_t<W, 1>, rows_t<W, 2>, rows_t<W, 3>, rows_t<W, 4>,
    rows_t<W, 5>,    rows_t<W, 6>, rows_t<W, 7>, rows_t<W, 8>};

// Output rows [o0, o1) for all `tokens` rows of x, MAX_CHUNK of them at a time.
// With more than MAX_CHUNK (a batch's verify step), the output rows go in blocks
// whose weights stay in L2 while every chunk of x passes over them, so the weights
// stream from memory once, not once a chunk (a 49152-row LM head at 32 tokens:
// 34 -> 21 ms). Each element is the same sums whatever the blocks and chunks.
constexpr size_t BLOCK_BYTES = 1 << 17;

template <Weights W>
void product_rows_of(const void* w, const float* x, float* y, int o0, int o1,
                     int ldy, int in, int tokens) {
  const size_t row_bytes = std::max<size_t>(in, 1) * (W == Weights::f32 ? 4 : 2);
  const int block = tokens <= MAX_CHUNK
                        ? o1 - o0
                        : std::max<int>(4, (int)(BLOCK_BYTES / row_bytes));
  for (int b0 = o0; b0 < o1; b0 += block) {
    const int b1 = std::min(o1, b0 + block);
    for (int t0 = 0; t0 < tokens; t0 += MAX_CHUNK) {
      int n = std::min(MAX_CHUNK, tokens - t0);
      ROWS<W>[n](w, x + (size_t)t0 * in, y + (size_t)t0 * ldy, b0, b1, ldy, in);
    }
  }
}

// A weight matrix as the kernels read it: its rows, in its storage type.
struct Matrix {
  const void* data;
  Weights type;
  int rows, in;

  // y[t * ldy + o] for rows o in [o0, o1) (of this matrix) and all tokens of x
  void product(const float* x, float* y, int o0, int o1, int ldy,
               int tokens) const {
    switch (type) {
      case Weights::f32: return product_rows_of<Weights::f32>(data, x, y, o0, o1, ldy, in, tokens);
      case Weights::f16: return product_rows_of<Weights::f16>(data, x, y, o0, o1, ldy, in, tokens);
      case Weights::bf16: return product_rows_of<Weights::bf16>(data, x, y, o0, o1, ldy, in, tokens);
    }
  }

  // the rows from `first` on, as a matrix of their own
  Matrix from(int first) const {
    size_t bytes = type == Weights::f32 ? 4 : 2;
    return {static_cast<const char*>(data) + (size_t)first * in * bytes, type,
            rows - first, in};
  }
};

// A weight's matrix: its own rows where they are dense, else a float32 copy in
// `scratch`.
Matrix matrix(const mx::array& w, std::vector<float>& scratch) {
  Matrix m{nullptr, Weights::f32, w.shape(0), w.shape(1)};
  if (w.dtype() == mx::float32 || !w.flags().row_contiguous) {
    m.data = dense(w, scratch);
  } else {
    m.data = w.data<uint16_t>();
    m.type = w.dtype() == mx::float16 ? Weights::f16 : Weights::bf16;
  }
  return m;
}

// Runs job(o0, o1) over a matrix's output rows, on every core when `weights`
// such matrices are big.
void over_rows(const Matrix& w, int weights,
               const std::function<void(int, int)>& job) {
  size_t bytes = (size_t)weights * w.rows * w.in * sizeof(float);
  Workers::get().split(w.rows, 4, bytes >= PARALLEL_BYTES, job);
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
    std::vector<float> xs, xa, ws;
    const float* x = aligned(dense(in[0], xs), in[0].size(), xa);
    const Matrix w = matrix(in[1], ws);
    int tokens = w.in ? (int)(in[0].size() / w.in) : 0;
    float* y = out.data<float>();
    over_rows(w, 1, [&](int o0, int o1) {
      w.product(x, y, o0, o1, w.rows, tokens);
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
    std::vector<float> xs, xa, gs, us;
    const float* x = aligned(dense(in[0], xs), in[0].size(), xa);
    const Matrix g = matrix(in[1], gs), u = matrix(in[2], us);
    int tokens = g.in ? (int)(in[0].size() / g.in) : 0;
    float* y = out.data<float>();
    over_rows(g, 2, [&](int o0, int o1) {
      // this part's gate and up products (as small_linear's), then
      // silu(gate) * up = gate * up / (1 + exp(-gate))
      const int width = o1 - o0;
      std::vector<float> gates((size_t)tokens * width), ups(gates.size());
      g.from(o0).product(x, gates.data(), 0, width, width, tokens);
      u.from(o0).product(x, ups.data(), 0, width, width, tokens);
      for (int t = 0; t < tokens; t++) {
        const float* gt = &gates[(size_t)t * width];
        const float* ut = &ups[(size_t)t * width];
        float* yt = y + (size_t)t * g.rows + o0;
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
