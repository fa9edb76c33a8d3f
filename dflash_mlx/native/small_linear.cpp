// `small_linear(x, w)`: x @ w.T for a few rows of x (a decoding step or a verify
// block), reading each row of w once, on every core.
//
// MLX's CPU matmul is one cblas_sgemm, whose general path copies all of w into a
// packed buffer on every call and is built for many rows of x: for 1-16 rows it
// runs far below the memory bandwidth that reading w needs. Here each group of
// output rows streams its rows of w once and multiplies them with every row of x
// held in L1. Every output element is the same sum in the same order whatever the
// number of rows of x and the row's place among them, so a token's products do not
// depend on how many tokens are verified with it.
//
// Built on first use by dflash_mlx/native/__init__.py against the installed MLX
// (its headers, libmlx and nanobind domain) for this machine's CPU.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sched.h>

#include <nanobind/nanobind.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

#if defined(__AVX512F__)
constexpr int LANES = 16;
#else
constexpr int LANES = 8;  // AVX2, or two NEON registers
#endif
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

constexpr int MAX_CHUNK = 8;  // rows of x multiplied per pass over a group of w rows
constexpr size_t PARALLEL_BYTES = 1 << 17;  // smaller weights run on one thread
constexpr int MAX_THREADS = 8;  // a few cores already saturate memory bandwidth

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(vec));
  return v;
}

inline float lane_sum(vec v) {
  float s = 0.0f;
  for (int l = 0; l < LANES; l++) s += v[l];
  return s;
}

// y[t, o] for o in [o0, o1), t < T, in groups of R output rows. Each element is
// LANES partial sums over `in` in order, then the tail, then their sum.
template <int T, int R>
void rows_fixed(const float* w, const float* x, float* y, int o0, int o1,
                int out, int in, int ldx) {
  const int body = in - in % LANES;
  int o = o0;
  for (; o + R <= o1; o += R) {
    vec acc[R][T];
    for (int r = 0; r < R; r++)
      for (int t = 0; t < T; t++) acc[r][t] = vec{};
    for (int i = 0; i < body; i += LANES) {
      vec xs[T];
      for (int t = 0; t < T; t++) xs[t] = load(x + (size_t)t * ldx + i);
      for (int r = 0; r < R; r++) {
        vec wr = load(w + (size_t)(o + r) * in + i);
        for (int t = 0; t < T; t++) acc[r][t] += wr * xs[t];
      }
    }
    for (int r = 0; r < R; r++) {
      const float* wr = w + (size_t)(o + r) * in;
      for (int t = 0; t < T; t++) {
        float tail = 0.0f;
        for (int i = body; i < in; i++) tail += wr[i] * x[(size_t)t * ldx + i];
        y[(size_t)t * out + o + r] = lane_sum(acc[r][t]) + tail;
      }
    }
  }
  if constexpr (R > 1) {
    if (o < o1) rows_fixed<T, 1>(w, x, y, o, o1, out, in, ldx);
  }
}

// More rows of w per group where x has few rows: more sums in registers per load.
template <int T>
void rows_t(const float* w, const float* x, float* y, int o0, int o1, int out,
            int in, int ldx) {
  constexpr int R = T <= 2 ? 4 : (T <= 4 ? 3 : 2);
  rows_fixed<T, R>(w, x, y, o0, o1, out, in, ldx);
}

using RowsFn = void (*)(const float*, const float*, float*, int, int, int, int,
                        int);
constexpr RowsFn ROWS[MAX_CHUNK + 1] = {
    nullptr,    rows_t<1>, rows_t<2>, rows_t<3>, rows_t<4>,
    rows_t<5>,  rows_t<6>, rows_t<7>, rows_t<8>};

// Output rows [o0, o1) for all `tokens` rows of x, MAX_CHUNK of them at a time.
void product_rows(const float* w, const float* x, float* y, int o0, int o1,
                  int out, int in, int tokens) {
  for (int t0 = 0; t0 < tokens; t0 += MAX_CHUNK) {
    int n = std::min(MAX_CHUNK, tokens - t0);
    ROWS[n](w, x + (size_t)t0 * in, y + (size_t)t0 * out, o0, o1, out, in, in);
  }
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Helper threads that split one product's output rows with the calling thread.
// Between the products of a forward they spin briefly, then sleep on a futex.
class Workers {
 public:
  static Workers& get() {
    static Workers* workers = new Workers();  // never destroyed: threads detach
    return *workers;
  }

  int threads() const { return (int)helpers_.size() + 1; }

  // job(part) for part in [0, parts); the caller runs part 0. Another thread
  // already running a job gets all its parts run inline.
  void run(int parts, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock() || parts <= 1 || helpers_.empty()) {
      for (int p = 0; p < parts; p++) job(p);
      return;
    }
    job_ = &job;
    parts_ = std::min(parts, threads());
    pending_.store((int)helpers_.size(), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    job(0);
    for (int p = parts_; p < parts; p++) job(p);
    while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
  }

 private:
  Workers() {
    int n = std::min(usable_cpus(), MAX_THREADS);
    for (int i = 1; i < n; i++) {
      helpers_.emplace_back([this, i] { loop(i); });
      helpers_.back().detach();
    }
  }

  static int usable_cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return std::max(1u, std::thread::hardware_concurrency());
  }

  void loop(int part) {
    unsigned seen = 0;
    while (true) {
      for (int spin = 0; spin < 4000; spin++) {
        if (generation_.load(std::memory_order_acquire) != seen) break;
        cpu_relax();
      }
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (part < parts_) (*job_)(part);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::vector<std::thread> helpers_;
  std::mutex busy_;
  std::atomic<unsigned> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 1;
};

void small_product(const float* w, const float* x, float* y, int out, int in,
                   int tokens) {
  auto& workers = Workers::get();
  size_t bytes = (size_t)out * in * sizeof(float);
  int parts = bytes < PARALLEL_BYTES ? 1 : workers.threads();
  int per = (out + parts - 1) / parts;
  per = (per + 3) / 4 * 4;  // whole groups of output rows per part
  workers.run(parts, [&](int part) {
    int o0 = part * per, o1 = std::min(out, o0 + per);
    if (o0 < o1) product_rows(w, x, y, o0, o1, out, in, tokens);
  });
}

class SmallLinear : public mx::UnaryPrimitive {
 public:
  explicit SmallLinear(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    if (!x.flags().row_contiguous || !w.flags().row_contiguous) {
      throw std::runtime_error("small_linear: inputs must be row-contiguous");
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_output_array(out);
    int rows = w.shape(0), in = w.shape(1);
    int tokens = in ? (int)(x.size() / in) : 0;
    encoder.dispatch([w = w.data<float>(), x = x.data<float>(),
                      y = out.data<float>(), rows, in, tokens]() {
      small_product(w, x, y, rows, in, tokens);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("small_linear runs on the CPU only");
  }

  const char* name() const override { return "SmallLinear"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }

  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }
};

mx::array small_linear(const mx::array& x, const mx::array& w) {
  if (x.dtype() != mx::float32 || w.dtype() != mx::float32) {
    throw std::invalid_argument("small_linear takes float32 arrays");
  }
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1)) {
    throw std::invalid_argument("small_linear: x (..., in) and w (out, in)");
  }
  auto stream = mx::default_stream(mx::Device::cpu);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(
      shape, mx::float32, std::make_shared<SmallLinear>(stream),
      {mx::contiguous(x, false, stream), mx::contiguous(w, false, stream)});
}

}  // namespace

NB_MODULE(_dflash_native, m) {
  nb::module_::import_("mlx.core");
  m.def("small_linear", &small_linear, nb::arg("x"), nb::arg("w"),
        "x @ w.T (float32, CPU) for a few rows of x, reading w once.");
  m.def("threads", [] { return Workers::get().threads(); },
        "Threads a large product is split over.");
  m.attr("lanes") = LANES;
}
