// block_attention: a few query rows over a KV cache, one pass per kv head, where
// MLX's CPU path is a matmul, a softmax and another matmul, each an op of its own.
#include <algorithm>
#include <cmath>

#include "ops.h"
#include "simd.h"
#include "workers.h"

namespace dflash {
namespace {

constexpr double PARALLEL_WORK = 1 << 17;  // rows x keys x dim below: one thread

// Query rows [r0, r1) of one kv head (each row: q, out, its visible keys
// [first, end)), over keys and values with row strides ks, vs and C = dim / LANES
// vectors per row.
// Scores: each key is loaded once for all the rows; values: two sets of
// accumulators (even and odd keys) so that no multiply-add waits on the last.
template <int C>
void attend_head(const float* const* q, float* const* out, const int* first,
                 const int* end, int rows, const float* k, int64_t ks,
                 const float* v, int64_t vs, float scale,
                 std::vector<float>& scores) {
  constexpr int MAX_ROWS = 32;  // rows sharing one pass over the keys
  const int keys = *std::max_element(end, end + rows);
  scores.resize((size_t)MAX_ROWS * keys);
  for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
    const int n = std::min(MAX_ROWS, rows - r0);
    // only the keys some row of this pass sees: a causal prefill chunk's early rows
    // skip the keys of its later tokens
    const int lo = *std::min_element(first + r0, first + r0 + n);
    const int hi = *std::max_element(end + r0, end + r0 + n);
    for (int j = lo; j < hi; j++) {
      vec kj[C];
      for (int c = 0; c < C; c++) kj[c] = load(k + j * ks + c * LANES);
      for (int r = 0; r < n; r++) {
        const float* qr = q[r0 + r];
        vec acc = kj[0] * load(qr);
        for (int c = 1; c < C; c++) acc += kj[c] * load(qr + c * LANES);
        scores[(size_t)r * keys + j] = lane_sum(acc) * scale;
      }
    }
    for (int r = 0; r < n; r++) {
      const int from = first[r0 + r];
      float* s = &scores[(size_t)r * keys + from];
      const int seen = end[r0 + r] - from;
      const float* vr = v + from * vs;
      const float best = max_of(s, seen);
      const int body = seen - seen % LANES;
      vec sums{};
      for (int j = 0; j < body; j += LANES) {
        vec e = vexp(load(s + j) - best);
        store(s + j, e);
        sums += e;
      }
      float total = lane_sum(sums);
      for (int j = body; j < seen; j++) {
        s[j] = vexp(vec{} + (s[j] - best))[0];
        total += s[j];
      }
      vec even[C] = {}, odd[C] = {};
      int j = 0;
      for (; j + 1 < seen; j += 2) {
        const float* v0 = vr + j * vs;
        const float* v1 = v0 + vs;
        for (int c = 0; c < C; c++) {
          even[c] += s[j] * load(v0 + c * LANES);
          odd[c] += s[j + 1] * load(v1 + c * LANES);
        }
      }
      if (j < seen)
        for (int c = 0; c < C; c++) even[c] += s[j] * load(vr + j * vs + c * LANES);
      float* o = out[r0 + r];
      for (int c = 0; c < C; c++) {
        store(o + c * LANES, (even[c] + odd[c]) / total);
      }
    }
  }
}

// attend_head for a prefill chunk's many rows: keys transposed into tiles of LANES
// once a call, so that q.k is plain multiply-adds (RB rows by two key tiles, no
// lane sums), and the weights.v products share each value row between rows. A row's
// result depends on its own query and keys only: tiles and vectors start at
// multiples of LANES of the key index, and keys a row does not see weigh exactly 0.
template <int C>
void attend_head_tiled(const float* const* q, float* const* out, const int* first,
                       const int* end, int rows, const float* k, int64_t ks,
                       const float* v, int64_t vs, float scale,
                       std::vector<float>& scores) {
  constexpr int D = C * LANES, MAX_ROWS = 32, RB = C <= 4 ? 4 : C == 8 ? 2 : 1;
  thread_local std::vector<float> tiles, totals;
  const int lo = *std::min_element(first, first + rows) / LANES * LANES;
  const int hi = *std::max_element(end, end + rows);
  const int padded = (hi - lo + LANES - 1) / LANES * LANES;  // keys in whole tiles
  tiles.resize((size_t)padded * D);
  for (int j = lo; j < lo + padded; j++) {
    float* tile = &tiles[(size_t)(j - lo) / LANES * D * LANES + (j - lo) % LANES];
    const float* kj = k + j * ks;
    for (int d = 0; d < D; d++) tile[d * LANES] = j < hi ? kj[d] : 0.0f;
  }
  ivec lane;
  for (int i = 0; i < LANES; i++) lane[i] = i;
  totals.resize(MAX_ROWS);
  for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
    const int n = std::min(MAX_ROWS, rows - r0);
    const int plo = *std::min_element(first + r0, first + r0 + n) / LANES * LANES;
    const int phi = *std::max_element(end + r0, end + r0 + n);
    const int width = (phi - plo + LANES - 1) / LANES * LANES;
    scores.resize((size_t)n * width);
    for (int j0 = plo; j0 < phi; j0 += 2 * LANES) {  // q.k, two key tiles at a time
      const float* t0 = &tiles[(size_t)(j0 - lo) / LANES * D * LANES];
      const bool pair = j0 + LANES < phi;
      const float* t1 = pair ? t0 + D * LANES : t0;
      for (int rb = 0; rb < n; rb += RB) {
        const float* qr[RB];
        for (int i = 0; i < RB; i++) qr[i] = q[r0 + std::min(rb + i, n - 1)];
        vec a0[RB] = {}, a1[RB] = {};
        for (int d = 0; d < D; d++) {
          const vec k0 = load(t0 + d * LANES), k1 = load(t1 + d * LANES);
          for (int i = 0; i < RB; i++) {
            const float x = qr[i][d];
            a0[i] += k0 * x;
            a1[i] += k1 * x;
          }
        }
        for (int i = 0; i < RB && rb + i < n; i++) {
          float* s = &scores[(size_t)(rb + i) * width + (j0 - plo)];
          store(s, a0[i] * scale);
          if (pair) store(s + LANES, a1[i] * scale);
        }
      }
    }
    for (int r = 0; r < n; r++) {  // exp(s - max) where seen, else exactly 0
      float* s = &scores[(size_t)r * width];
      const int from = first[r0 + r] - plo, to = end[r0 + r] - plo;
      const float best = max_of(s + from, to - from);
      vec sums{};
      for (int j = 0; j < width; j += LANES) {
        const ivec at = lane + j;
        const vec e = vexp(load(s + j) - best);
        const vec kept = (at >= from && at < to) ? e : vec{};
        store(s + j, kept);
        sums += kept;
      }
      totals[r] = lane_sum(sums);
    }
    for (int rb = 0; rb < n; rb += RB) {  // weights.v, RB rows a value row
      const int m = std::min(RB, n - rb);
      int from = width, to = 0;
      for (int i = 0; i < m; i++) {
        from = std::min(from, first[r0 + rb + i] - plo);
        to = std::max(to, end[r0 + rb + i] - plo);
      }
      const float* w[RB];
      for (int i = 0; i < RB; i++)
        w[i] = &scores[(size_t)(rb + std::min(i, m - 1)) * width];
      vec acc[RB][C] = {};
      for (int j = from; j < to; j++) {
        const float* vj = v + (int64_t)(plo + j) * vs;
        vec vv[C];
        for (int c = 0; c < C; c++) vv[c] = load(vj + c * LANES);
        for (int i = 0; i < RB; i++)
          for (int c = 0; c < C; c++) acc[i][c] += w[i][j] * vv[c];
      }
      for (int i = 0; i < m; i++)
        for (int c = 0; c < C; c++)
          store(out[r0 + rb + i] + c * LANES, acc[i][c] / totals[rb + i]);
    }
  }
}

using HeadFn = void (*)(const float* const*, float* const*, const int*,
                        const int*, int, const float*, int64_t, const float*,
                        int64_t, float, std::vector<float>&);

// From this many query tokens (a prefill chunk) the tiled kernel: the Python side
// routes products of more tokens to BLAS from the same count (ops.MAX_TOKENS).
constexpr int TILED_FROM = 17;

HeadFn head_kernel(int dim, bool tiled = false) {
  if (dim % LANES != 0) return nullptr;
  switch (dim / LANES) {
    case 1: return tiled ? attend_head_tiled<1> : attend_head<1>;
    case 2: return tiled ? attend_head_tiled<2> : attend_head<2>;
    case 4: return tiled ? attend_head_tiled<4> : attend_head<4>;
    case 8: return tiled ? attend_head_tiled<8> : attend_head<8>;
    case 16: return tiled ? attend_head_tiled<16> : attend_head<16>;
  }
  return nullptr;
}

struct AttentionShape {
  int batch, heads, kv_heads, tokens, keys, dim;
  int64_t q_stride[4], k_stride[4], v_stride[4];  // elements; the last is 1
};

// Rows [r0, r1) in (batch, kv head, head of its group, token) order, written to
// the output (batch, tokens, heads, dim); rows of one kv head go together. Token t
// sees keys from max(0, skip + t) on: a sliding window's start. `visible` (or
// null: all S) is each batch row's keys, its block's last: rows of a batch of
// sequences of different lengths, each row computed as if it were alone.
void attend_rows(const float* q, const float* k, const float* v, float* out,
                 const AttentionShape& s, float scale, bool causal, int skip,
                 const int* visible, int r0, int r1) {
  thread_local std::vector<float> scores;
  thread_local std::vector<const float*> queries;
  thread_local std::vector<float*> outputs;
  thread_local std::vector<int> firsts, ends;
  const HeadFn kernel = head_kernel(s.dim, s.tokens >= TILED_FROM);
  const int groups = s.heads / s.kv_heads;
  const int per_head = groups * s.tokens;
  for (int r = r0; r < r1;) {
    const int head_of = r / per_head;
    const int end = std::min(r1, (head_of + 1) * per_head);
    const int b = head_of / s.kv_heads, kvh = head_of % s.kv_heads;
    const int keys = visible ? visible[b] : s.keys;
    queries.clear();
    outputs.clear();
    firsts.clear();
    ends.clear();
    for (; r < end; r++) {
      int t = r % s.tokens, h = kvh * groups + (r % per_head) / s.tokens;
      queries.push_back(q + b * s.q_stride[0] + h * s.q_stride[1] +
                        t * s.q_stride[2]);
      outputs.push_back(out + (((int64_t)b * s.tokens + t) * s.heads + h) * s.dim);
      firsts.push_back(std::max(0, skip + t));
      ends.push_back(causal ? keys - s.tokens + t + 1 : keys);
    }
    kernel(queries.data(), outputs.data(), firsts.data(), ends.data(),
           (int)queries.size(),
           k + b * s.k_stride[0] + kvh * s.k_stride[1], s.k_stride[2],
           v + b * s.v_stride[0] + kvh * s.v_stride[1], s.v_stride[2], scale,
           scores);
  }
}

AttentionShape attention_shape(const mx::array& q, const mx::array& k,
                               const mx::array& v) {
  AttentionShape s{q.shape(0), q.shape(1), k.shape(1), q.shape(2), k.shape(2),
                   q.shape(3), {}, {}, {}};
  for (int i = 0; i < 4; i++) {
    s.q_stride[i] = q.strides()[i];
    s.k_stride[i] = k.strides()[i];
    s.v_stride[i] = v.strides()[i];
  }
  return s;
}

}  // namespace

bool attention_fits(int dim) { return head_kernel(dim) != nullptr; }

namespace {

mx::array attention_op(const mx::array& q, const mx::array& k, const mx::array& v,
                       float scale, bool causal, int skip, std::vector<int> visible) {
  auto run = [scale, causal, skip, visible](const std::vector<mx::array>& in,
                                            mx::array& out) {
    const auto &q = in[0], &k = in[1], &v = in[2];
    std::vector<float> qs, ks, vs;
    AttentionShape s = attention_shape(q, k, v);
    const float* qp = q.data<float>();
    if (q.strides()[3] != 1) {
      qp = dense(q, qs);
      s.q_stride[0] = (int64_t)s.heads * s.tokens * s.dim;
      s.q_stride[1] = (int64_t)s.tokens * s.dim;
      s.q_stride[2] = s.dim;
    }
    // keys and values are read where the cache holds them, as strided views
    const float* kp = k.data<float>();
    const float* vp = v.data<float>();
    if (k.strides()[3] != 1 || v.strides()[3] != 1) {
      kp = dense(k, ks);
      vp = dense(v, vs);
      for (auto* st : {s.k_stride, s.v_stride}) {
        st[0] = (int64_t)s.kv_heads * s.keys * s.dim;
        st[1] = (int64_t)s.keys * s.dim;
        st[2] = s.dim;
      }
    }
    float* o = out.data<float>();
    int rows = s.batch * s.heads * s.tokens;
    double work = (double)rows * s.keys * s.dim;
    const int* seen = visible.empty() ? nullptr : visible.data();
    Workers::get().split(rows, 1, work >= PARALLEL_WORK, [&](int r0, int r1) {
      attend_rows(qp, kp, vp, o, s, scale, causal, skip, seen, r0, r1);
    });
  };
  std::vector<float> params{scale, causal ? 1.0f : 0.0f, (float)skip};
  for (int n : visible) params.push_back((float)n);
  mx::Shape shape{q.shape(0), q.shape(2), q.shape(1), q.shape(3)};
  return kernel_output("BlockAttention", shape, run, {q, k, v}, params);
}

bool attention_shapes_fit(const mx::array& q, const mx::array& k,
                          const mx::array& v) {
  return q.ndim() == 4 && k.ndim() == 4 && v.shape() == k.shape() &&
         q.shape(0) == k.shape(0) && q.shape(3) == k.shape(3) && k.shape(1) != 0 &&
         q.shape(1) % k.shape(1) == 0 && head_kernel(q.shape(3)) != nullptr;
}

}  // namespace

mx::array block_attention(const mx::array& q, const mx::array& k,
                          const mx::array& v, float scale, bool causal,
                          int skip) {
  const int T = q.ndim() == 4 ? q.shape(2) : 0;
  const int S = k.ndim() == 4 ? k.shape(2) : 0;
  if (!attention_shapes_fit(q, k, v) || (causal && T > S) ||
      (causal ? skip > S - T : skip + T > S)) {
    throw std::invalid_argument(
        "block_attention: q (B, H, T, D), k and v (B, Hkv, S, D), H a multiple of "
        "Hkv, T <= S when causal, D a power-of-two multiple of the vector width, "
        "every query seeing a key (skip + t below its last visible key)");
  }
  return attention_op(q, k, v, scale, causal, skip, {});
}

mx::array ragged_attention(const mx::array& q, const mx::array& k,
                           const mx::array& v, float scale,
                           const std::vector<int>& visible) {
  const int T = q.ndim() == 4 ? q.shape(2) : 0;
  const int S = k.ndim() == 4 ? k.shape(2) : 0;
  bool fits = attention_shapes_fit(q, k, v) && (int)visible.size() == q.shape(0);
  for (int n : visible) fits = fits && T <= n && n <= S;
  if (!fits) {
    throw std::invalid_argument(
        "ragged_attention: q (B, H, T, D), k and v (B, Hkv, S, D) as for "
        "block_attention, and one count per batch row of the keys it sees (its "
        "block's T last), between T and S");
  }
  return attention_op(q, k, v, scale, true, -(1 << 30), visible);
}

}  // namespace dflash
