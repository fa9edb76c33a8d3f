// Vectors of floats as wide as the CPU's registers (GCC/Clang vector extensions,
// compiled with -march=native), and the few operations the kernels share. Every
// reduction here has a fixed order, so a result depends on its inputs only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dflash {

#if defined(__AVX512F__)
constexpr int LANES = 16;
#else
constexpr int LANES = 8;  // AVX2, or two NEON registers
#endif
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef int ivec __attribute__((vector_size(LANES * sizeof(int))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(vec));
  return v;
}

inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof(vec)); }

// acc + a * b. Where the CPU has fused multiply-adds, one instruction and one
// rounding, written out: the build forbids the compiler fusing on its own (see
// EXACT_SUMS), so every kernel that calls this rounds alike whatever its rows. A
// product's inner loop is then one instruction a weight and row, not two (at 16+
// rows the products are bound by arithmetic).
inline vec fma(vec a, vec b, vec acc) {
#if defined(__AVX512F__)
  return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(__FMA__) && defined(__AVX__)
  return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#elif defined(__aarch64__)
  vec out;
  for (int l = 0; l < LANES; l++) out[l] = __builtin_fmaf(a[l], b[l], acc[l]);
  return out;  // aarch64 always has fused multiply-adds
#else
  return acc + a * b;  // no fused instruction: two roundings, still one order
#endif
}

// Weights stored as float32, float16 or bfloat16, read as float32 vectors.
enum class Weights { f32, f16, bf16 };

template <Weights W>
inline vec load_weights(const void* base, size_t i) {
  if constexpr (W == Weights::f32) {
    return load(static_cast<const float*>(base) + i);
  } else if constexpr (W == Weights::bf16) {  // the upper half of a float32
    typedef uint16_t u16 __attribute__((vector_size(LANES * 2)));
    typedef uint32_t u32 __attribute__((vector_size(LANES * 4)));
    u16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, sizeof(h));
    u32 bits = __builtin_convertvector(h, u32) << 16;
    vec v;
    std::memcpy(&v, &bits, sizeof(vec));
    return v;
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
#if defined(__AVX512F__)
    return (vec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
#elif defined(__F16C__) && defined(__AVX__)
    return (vec)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
    typedef _Float16 h16 __attribute__((vector_size(LANES * 2)));
    h16 h;
    std::memcpy(&h, p, sizeof(h));
    return __builtin_convertvector(h, vec);
#endif
  }
}

template <Weights W>
inline float weight_at(const void* base, size_t i) {
  if constexpr (W == Weights::f32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (W == Weights::bf16) {
    uint32_t bits = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  } else {
    _Float16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(base) + i, sizeof(h));
    return float(h);
  }
}

template <int N>
struct Lanes {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};

// The lanes' sum as a halving tree (half + half, down to 4 lanes). The halves
// as shuffles, not copies through memory: an accumulator whose address is taken
// stays on the stack, and a product's inner loop then stores and reloads every
// sum at every step (half the speed, GCC 12).
template <int N>
inline float tree_sum(typename Lanes<N>::type v) {
  if constexpr (N == 4) {
    return (v[0] + v[2]) + (v[1] + v[3]);
  } else {
    typename Lanes<N / 2>::type lo, hi;
#if defined(__clang__) || __GNUC__ >= 12
    if constexpr (N == 16) {
      lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
      hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    } else {
      lo = __builtin_shufflevector(v, v, 0, 1, 2, 3);
      hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);
    }
#else
    std::memcpy(&lo, &v, sizeof(lo));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
#endif
    return tree_sum<N / 2>(lo + hi);
  }
}

inline float lane_sum(vec v) { return tree_sum<LANES>(v); }

// exp(x) = e^r * 2^n with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
// (within 1e-7 relative, as cpu_ops._exp); 0 below -87.3.
inline vec vexp(vec x) {
  const vec lo = vec{} - 87.3f, hi = vec{} + 88.7f;
  vec xc = x < lo ? lo : (x > hi ? hi : x);
  vec n = (xc * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
  vec r = xc - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  vec p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec two_n;
  std::memcpy(&two_n, &bits, sizeof(vec));
  vec y = p * two_n;
  return x < lo ? vec{} : y;
}

// The largest of n floats, NaNs passed over as std::max does. A max rounds
// nothing, so taking it a vector at a time gives the scalar loop's result.
inline float max_of(const float* x, int n) {
  vec best = vec{} - INFINITY;
  int i = 0;
  for (; i + LANES <= n; i += LANES) {
    const vec v = load(x + i);
    best = v > best ? v : best;
  }
  float m = -INFINITY;
  for (int l = 0; l < LANES; l++) m = std::max(m, best[l]);
  for (; i < n; i++) m = std::max(m, x[i]);
  return m;
}

// The sum of squares of n floats: LANES partial sums in order, their tree sum,
// then the tail.
inline float sum_of_squares(const float* x, int n) {
  const int body = n - n % LANES;
  vec acc{};
  for (int i = 0; i < body; i += LANES) {
    vec v = load(x + i);
    acc += v * v;
  }
  float sum = lane_sum(acc);
  for (int i = body; i < n; i++) sum += x[i] * x[i];
  return sum;
}

}  // namespace dflash
