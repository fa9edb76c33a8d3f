// Vectors of floats as wide as the CPU's registers (GCC/Clang vector extensions,
// compiled with -march=native), and the few operations the kernels share. Every
// reduction here has a fixed order, so a result depends on its inputs only.
#pragma once

#include <cstring>

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

template <int N>
struct Lanes {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
};

// The lanes' sum as a halving tree (half + half, down to 4 lanes).
template <int N>
inline float tree_sum(typename Lanes<N>::type v) {
  if constexpr (N == 4) {
    return (v[0] + v[2]) + (v[1] + v[3]);
  } else {
    typename Lanes<N / 2>::type lo, hi;
    std::memcpy(&lo, &v, sizeof(lo));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
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
