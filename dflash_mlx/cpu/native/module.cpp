// The Python module: the ops of ops.h, taking and returning MLX arrays (this
// module joins MLX's nanobind domain, "mlx", at build time).
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "ops.h"
#include "simd.h"
#include "workers.h"

namespace nb = nanobind;

NB_MODULE(_dflash_native, m) {
  nb::module_::import_("mlx.core");
  m.def("small_linear", &dflash::small_linear, nb::arg("x"), nb::arg("w"),
        "x @ w.T (float32, CPU) for a few rows of x, reading w once.");
  m.def("gated_linear", &dflash::gated_linear, nb::arg("x"), nb::arg("gate"),
        nb::arg("up"), "silu(x @ gate.T) * (x @ up.T) (float32, CPU).");
  m.def("block_attention", &dflash::block_attention, nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("scale"), nb::arg("causal"), nb::arg("skip") = -(1 << 30),
        "Attention of (B, H, T, D) queries over (B, Hkv, S, D) keys and values "
        "(float32, CPU), causal over the last T keys or not, query t seeing keys "
        "from skip + t on (a sliding window; default: all): (B, T, H, D).");
  m.def("ragged_attention", &dflash::ragged_attention, nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("scale"), nb::arg("visible"),
        "block_attention, causal, for a batch of sequences of different lengths: "
        "row b sees its first visible[b] keys (its block's T last): (B, T, H, D).");
  m.def("attention_fits", &dflash::attention_fits, nb::arg("dim"),
        "Whether block_attention takes heads of this size (a power-of-two "
        "multiple of the vector width).");
  m.def("rms_norm", &dflash::rms_norm, nb::arg("x"), nb::arg("weight"),
        nb::arg("eps"), "x / sqrt(mean(x^2) + eps) * weight (float32, CPU).");
  m.def("rope", &dflash::rope, nb::arg("x"), nb::arg("cos"), nb::arg("sin"),
        "(B, L, H, D) x * cos + rotate_half(x) * sin as (B, H, L, D) (float32, "
        "CPU); sin's first half is negated.");
  m.def("threads", [] { return dflash::Workers::get().threads(); },
        "Threads a large kernel is split over.");
  m.attr("lanes") = dflash::LANES;
}
