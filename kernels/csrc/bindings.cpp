// The Python module of the CPU kernels: one extension, built once by kernels/cpu.py.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "cpu_kernels.h"
#include "decode_layers.h"

namespace {

// The kernels run without Python's lock: the server's event loop answers probes and streams tokens while the
// engine's thread is inside one, where it waited for the whole call before (up to a prefill's attention).
const pybind11::call_guard<pybind11::gil_scoped_release> kWithoutGil;

// What quantized::linear_prepack_fp16 returns (a torch.ScriptObject), as the C++ object it holds.
PackedFp16Weight packed_fp16_weight(const pybind11::object& packed) {
  return torch::jit::toIValue(packed, c10::AnyType::get()).toCustomClass<LinearPackedParamsBase>();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "Paged decode attention (CPU)", kWithoutGil);
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "Paged causal prefill attention (CPU); tiles: on AMX tiles where the queries are bf16 and the CPU has them",
        kWithoutGil, pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_tables"), pybind11::arg("cu_seqlens_q"), pybind11::arg("seq_lens"), pybind11::arg("scale"),
        pybind11::arg("window"), pybind11::arg("tiles") = true);
  m.def("store_kv", &store_kv, "Write new keys and values into their cache slots (CPU)", kWithoutGil);
  m.def("rms_norm", &rms_norm, "RMSNorm over rows", kWithoutGil);
  m.def("add_rms_norm_", &add_rms_norm_, "hidden += delta in place, then RMSNorm of hidden", kWithoutGil);
  m.def("rotary_", &rotary_, "Rotary embedding in place on q and k", kWithoutGil);
  m.def("silu_mul", &silu_mul, "SiLU(gate) * up of a fused gate/up row", kWithoutGil);
  m.def("int8_linear", &int8_linear, "x times int8 weights with group scales, transposed", kWithoutGil);
  m.def("int4_linear", &int4_linear, "x times packed int4 weights with group scales and minimums, transposed",
        kWithoutGil);
  m.def("few_rows_linear", &few_rows_linear, "One to eight rows of x times bf16 weights, transposed", kWithoutGil);
  m.def("row_invariant_linear", &row_invariant_linear,
        "Any rows of x times bf16 weights, transposed, each row summed in one order whatever the row count",
        kWithoutGil);
  m.def("amx_pack_weight", &amx_pack_weight, "bf16 weights [N, K] in the tile layout amx_linear reads", kWithoutGil);
  m.def("amx_linear_usable", &amx_linear_usable, "Whether this build has the AMX kernels and may use the tiles");
  m.def("amx_linear", &amx_linear, "x times weights packed by amx_pack_weight, transposed, on AMX tiles", kWithoutGil);
  m.def("amx_silu_mul_linear", &amx_silu_mul_linear,
        "SiLU(gate) * up of x times stacked gate/up weights packed by amx_pack_weight, on AMX tiles",
        kWithoutGil);
  m.def("amx_few_rows_linear", &amx_few_rows_linear,
        "One to eight rows of x times weights packed by amx_pack_weight, transposed, without tiles",
        kWithoutGil);
  m.def("greedy_tokens", &greedy_tokens, "Each row's first highest logit", kWithoutGil);
  m.def("few_rows_limit", &few_rows_limit, "The rows up to which few_rows_linear beats a bf16 GEMM here");
  // module_local: every ISA variant is its own extension with this same type, and a process may load several.
  pybind11::class_<DecodeLayers>(m, "DecodeLayers", pybind11::module_local(),
                                 "Every decoder layer of a step in one call (bf16, int8 or int4, or fp16 under fp32)")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, double, bool>())
      .def("add_layer", &DecodeLayers::add_layer)
      .def("add_fp16_layer",
           [](DecodeLayers& self, const pybind11::object& qkv, const pybind11::object& o_proj,
              const pybind11::object& gate_up, const pybind11::object& down, at::Tensor mlp_norm,
              at::Tensor next_norm, at::Tensor cos, at::Tensor sin, int64_t window) {
             self.add_fp16_layer(packed_fp16_weight(qkv), packed_fp16_weight(o_proj), packed_fp16_weight(gate_up),
                                 packed_fp16_weight(down), mlp_norm, next_norm, cos, sin, window);
           })
      .def("add_quantized_layer", &DecodeLayers::add_quantized_layer)
      .def("forward", &DecodeLayers::forward, kWithoutGil);
}
