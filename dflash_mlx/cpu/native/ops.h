// The MLX ops the native kernels provide, and what their primitives share.
//
// MLX's CPU backend runs a few-token forward (a decoding step, a verify block)
// far from the memory bandwidth its weights need: each matmul is a cblas_sgemm
// that copies the whole weight into a packed buffer, and each small op (a norm is
// eight of them) costs a dispatch and an allocation. These ops read each weight
// row once on every core and do a norm, a gated product, a rotation or an
// attention in one pass. All are batch-invariant: every output element is the
// same sums in the same order whatever the number of tokens and a token's place
// among them, so a token's forward in a verify block equals its forward in a
// plain step, bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/types/half_types.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace dflash {

namespace mx = mlx::core;

// x @ w.T for (..., in) x and (out, in) w.
mx::array small_linear(const mx::array& x, const mx::array& w);
// silu(x @ gate.T) * (x @ up.T): a SwiGLU MLP's first half.
mx::array gated_linear(const mx::array& x, const mx::array& gate,
                       const mx::array& up);
// (B, H, T, D) queries over (B, Hkv, S, D) keys and values: (B, T, H, D), for
// head dims D that `attention_fits`.
bool attention_fits(int dim);
mx::array block_attention(const mx::array& q, const mx::array& k,
                          const mx::array& v, float scale, bool causal,
                          int skip);
// Causal attention of a batch of sequences of different lengths: row b sees its
// first visible[b] keys, the last T of them its block's (a row alone would get
// exactly the same numbers from block_attention).
mx::array ragged_attention(const mx::array& q, const mx::array& k,
                           const mx::array& v, float scale,
                           const std::vector<int>& visible);

// x / sqrt(mean(x^2) + eps) * weight over the last axis.
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps);
// (B, L, H, D) x rotated by (L, 1, D) cos and sign-folded sin tables: (B, H, L, D).
mx::array rope(const mx::array& x, const mx::array& cos, const mx::array& sin);

// An array's elements in row-major order as float32: its own buffer when it is a
// row-contiguous float32 array, else a copy in `scratch` (inputs here are a few
// rows at most; weights are dense).
inline const float* dense(const mx::array& a, std::vector<float>& scratch) {
  if (a.flags().row_contiguous && a.dtype() == mx::float32) return a.data<float>();
  scratch.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  std::vector<int> index(a.ndim(), 0);
  for (size_t n = 0; n < a.size(); n++) {
    int64_t offset = 0;
    for (int d = 0; d < a.ndim(); d++) offset += index[d] * strides[d];
    switch (a.dtype()) {
      case mx::float16: scratch[n] = float(a.data<mx::float16_t>()[offset]); break;
      case mx::bfloat16: scratch[n] = float(a.data<mx::bfloat16_t>()[offset]); break;
      default: scratch[n] = a.data<float>()[offset];
    }
    for (int d = a.ndim() - 1; d >= 0 && ++index[d] == shape[d]; d--) index[d] = 0;
  }
  return scratch.data();
}

// n floats at p, from a 64-byte boundary: `p` itself where it starts on one, else
// a copy in `scratch`. MLX's CPU buffers start 8 bytes past one, and a vector load
// across two cache lines costs two: the products' few rows of x, read once for
// every weight row, ran 1.4-2x faster aligned (one thread, Intel Xeon, AVX-512).
constexpr uintptr_t LINE = 64;
inline const float* aligned(const float* p, size_t n, std::vector<float>& scratch) {
  if (reinterpret_cast<uintptr_t>(p) % LINE == 0) return p;
  scratch.resize(n + LINE / sizeof(float));
  float* q = scratch.data();
  q += (LINE - reinterpret_cast<uintptr_t>(q) % LINE) % LINE / sizeof(float);
  std::memcpy(q, p, n * sizeof(float));
  return q;
}

// A CPU-only primitive with one output of a given shape: `eval_cpu` allocates the
// output and dispatches `run(inputs, output)` on the stream's thread.
class Kernel : public mx::UnaryPrimitive {
 public:
  using Run = std::function<void(const std::vector<mx::array>&, mx::array&)>;

  Kernel(mx::Stream stream, const char* name, mx::Shape shape, Run run,
         std::vector<float> params = {})
      : mx::UnaryPrimitive(stream), name_(name), shape_(std::move(shape)),
        run_(std::move(run)), params_(std::move(params)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, run = run_]() mutable { run(inputs, out); });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(std::string(name_) + " runs on the CPU only");
  }

  const char* name() const override { return name_; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const Kernel&>(other);
    return name_ == o.name_ && params_ == o.params_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    return {shape_};
  }

 private:
  const char* name_;
  mx::Shape shape_;
  Run run_;
  std::vector<float> params_;  // what makes two kernels of a name differ
};

// The float32 CPU array of `name`'s kernel, or an error saying what it takes.
// The first `activations` inputs must be float32, the others (weights) float32,
// float16 or bfloat16.
inline mx::array kernel_output(const char* name, mx::Shape shape, Kernel::Run run,
                               std::vector<mx::array> inputs,
                               std::vector<float> params = {},
                               size_t activations = 1) {
  for (size_t i = 0; i < inputs.size(); i++) {
    auto t = inputs[i].dtype();
    bool half = t == mx::float16 || t == mx::bfloat16;
    if (t != mx::float32 && (i < activations || !half)) {
      throw std::invalid_argument(
          std::string(name) + " takes float32 activations and float32, float16 " +
          "or bfloat16 weights");
    }
  }
  auto stream = mx::default_stream(mx::Device::cpu);
  auto kernel = std::make_shared<Kernel>(stream, name, shape, std::move(run),
                                         std::move(params));
  return mx::array(std::move(shape), mx::float32, std::move(kernel),
                   std::move(inputs));
}

}  // namespace dflash
