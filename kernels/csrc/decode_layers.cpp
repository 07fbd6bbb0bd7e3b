#include "decode_layers.h"

#include "cpu_kernels.h"

DecodeLayers::DecodeLayers(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t hidden_size,
                           int64_t intermediate_size, double eps, double scale, bool batch_invariant)
    : num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      hidden_size_(hidden_size),
      intermediate_size_(intermediate_size),
      eps_(eps),
      scale_(scale),
      batch_invariant_(batch_invariant),
      few_rows_(batch_invariant ? 0 : few_rows_limit()) {}

void DecodeLayers::add_layer(at::Tensor qkv, at::Tensor o_proj, at::Tensor gate_up, at::Tensor down,
                             at::Tensor mlp_norm, at::Tensor next_norm, at::Tensor cos, at::Tensor sin,
                             int64_t window) {
  const auto fits = [](const at::Tensor& weight, int64_t outputs) {
    if (weight.scalar_type() != at::kBFloat16 || !weight.is_contiguous()) return false;
    if (weight.dim() == 2) return weight.size(0) == outputs;
    return weight.dim() == 6 && weight.size(0) == (outputs + 31) / 32;
  };
  TORCH_CHECK(fits(qkv, (num_heads_ + 2 * num_kv_heads_) * head_dim_) && fits(o_proj, hidden_size_) &&
                  fits(gate_up, 2 * intermediate_size_) && fits(down, hidden_size_),
              "add_layer takes bf16 weights, [N, K] or packed by amx_pack_weight, of the model's sizes");
  layers_.push_back({qkv, o_proj, gate_up, down, mlp_norm, next_norm, cos, sin, window, {}, {}});
}

void DecodeLayers::add_fp16_layer(PackedFp16Weight qkv, PackedFp16Weight o_proj, PackedFp16Weight gate_up,
                                  PackedFp16Weight down, at::Tensor mlp_norm, at::Tensor next_norm, at::Tensor cos,
                                  at::Tensor sin, int64_t window) {
  TORCH_CHECK(qkv && o_proj && gate_up && down, "add_fp16_layer takes four packed weights");
  layers_.push_back({{}, {}, {}, {}, mlp_norm, next_norm, cos, sin, window, {qkv, o_proj, gate_up, down}, {}});
}

void DecodeLayers::add_quantized_layer(std::vector<at::Tensor> qkv, std::vector<at::Tensor> o_proj,
                                       std::vector<at::Tensor> gate_up, std::vector<at::Tensor> down,
                                       at::Tensor mlp_norm, at::Tensor next_norm, at::Tensor cos, at::Tensor sin,
                                       int64_t window) {
  const auto fits = [](const std::vector<at::Tensor>& weight, int64_t outputs) {
    if (weight.size() != 2 && weight.size() != 3) return false;
    const at::ScalarType codes = weight.size() == 2 ? at::kChar : at::kByte;
    return weight[0].dim() == 2 && weight[0].scalar_type() == codes && weight[0].size(0) == outputs;
  };
  TORCH_CHECK(fits(qkv, (num_heads_ + 2 * num_kv_heads_) * head_dim_) && fits(o_proj, hidden_size_) &&
                  fits(gate_up, 2 * intermediate_size_) && fits(down, hidden_size_),
              "add_quantized_layer takes int8 (codes, scales) or int4 (codes, scales, mins) weights of the "
              "model's sizes");
  layers_.push_back(
      {{}, {}, {}, {}, mlp_norm, next_norm, cos, sin, window, {}, {qkv, o_proj, gate_up, down}});
}

// fp16 weights: fbgemm's GEMM, as Fp16WeightLinear calls it; quantised ones: the kernel QuantizedLinear calls.
at::Tensor DecodeLayers::linear(const at::Tensor& x, const Layer& layer, Weight weight) const {
  if (layer.fp16[weight]) return layer.fp16[weight]->apply_dynamic(x);
  const std::vector<at::Tensor>& quantized = layer.quantized[weight];
  if (quantized.size() == 2) return int8_linear(x, quantized[0], quantized[1]);
  if (quantized.size() == 3) return int4_linear(x, quantized[0], quantized[1], quantized[2]);
  const int64_t q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
  switch (weight) {
    case kQkv: return bf16_linear(x, layer.qkv, q_size + 2 * kv_size);
    case kOProj: return bf16_linear(x, layer.o_proj, hidden_size_);
    case kGateUp: return bf16_linear(x, layer.gate_up, 2 * intermediate_size_);
    case kDown: return bf16_linear(x, layer.down, hidden_size_);
  }
  TORCH_CHECK(false, "no such weight");
}

// As the model's bf16 linears (server/models/linear.py) choose: weights packed for the tiles (AmxBf16WeightLinear)
// take the few-rows kernel over that layout up to its limit and the tiles above it; plain [N, K] weights
// (Bf16WeightLinear) the few-rows kernel and oneDNN's GEMM. In batch-invariant mode, no few rows: the tiles at
// every row count (RowInvariantAmxBf16Linear), or the row-invariant kernel (RowInvariantBf16Linear).
at::Tensor DecodeLayers::bf16_linear(const at::Tensor& x, const at::Tensor& weight, int64_t out_features) const {
  const bool few = x.size(0) <= few_rows_;
  if (weight.dim() == 2 && batch_invariant_) return row_invariant_linear(x, weight);
  if (weight.dim() == 2) return few ? few_rows_linear(x, weight) : at::linear(x, weight);
  return few ? amx_few_rows_linear(x, weight, out_features) : amx_linear(x, weight, out_features);
}

// As SiluMulOfGateUp where the decoder takes it (tile weights, more rows than the few-rows kernel's), the
// activation inside the AMX kernel; elsewhere the layer, then the activation.
at::Tensor DecodeLayers::swiglu(const at::Tensor& x, const Layer& layer) const {
  if (layer.gate_up.defined() && layer.gate_up.dim() == 6 && x.size(0) > few_rows_)
    return amx_silu_mul_linear(x, layer.gate_up, intermediate_size_);
  return silu_mul(linear(x, layer, kGateUp));
}

at::Tensor DecodeLayers::forward(at::Tensor hidden, at::Tensor normed, at::Tensor positions,
                                 const std::vector<at::Tensor>& k_caches, const std::vector<at::Tensor>& v_caches,
                                 at::Tensor slots, at::Tensor decode_tables, at::Tensor decode_lens,
                                 at::Tensor prefill_tables, at::Tensor query_starts, at::Tensor prefill_lens,
                                 bool prompt_tiles) const {
  TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
              "one K and one V cache per layer");
  const int64_t tokens = hidden.size(0), decoding = decode_lens.size(0);
  TORCH_CHECK(decoding <= tokens, "more decoding rows than tokens");
  const int64_t q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
  // As AttentionBackend.forward: the decoding rows through the decode kernel, the prompt chunks after them through
  // the prefill kernel, each into its rows of one output where the step holds both.
  const auto attend = [&](const at::Tensor& q, size_t index, int64_t window) {
    const at::Tensor &k_cache = k_caches[index], &v_cache = v_caches[index];
    const auto decode = [&](const at::Tensor& rows) {
      return paged_decode_attention(rows, k_cache, v_cache, decode_tables, decode_lens, scale_, window);
    };
    const auto prefill = [&](const at::Tensor& rows) {
      return paged_prefill_attention(rows, k_cache, v_cache, prefill_tables, query_starts, prefill_lens, scale_,
                                     window, prompt_tiles);
    };
    if (decoding == tokens) return decode(q);
    if (!decoding) return prefill(q);
    at::Tensor out = at::empty_like(q);
    out.narrow(0, 0, decoding).copy_(decode(q.narrow(0, 0, decoding)));
    out.narrow(0, decoding, tokens - decoding).copy_(prefill(q.narrow(0, decoding, tokens - decoding)));
    return out;
  };
  for (size_t index = 0; index < layers_.size(); ++index) {
    const Layer& layer = layers_[index];
    const at::Tensor qkv = linear(normed, layer, kQkv);
    TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size && qkv.stride(1) == 1, "layer ", index,
                "'s Q/K/V weight is not of the model's size");
    // Each part's heads as one as_strided view: a narrow and a view took 1.2-1.6 us a part, as_strided 0.45.
    const auto heads = [&](int64_t first, int64_t count) {
      return qkv.as_strided({tokens, count, head_dim_}, {qkv.stride(0), head_dim_, 1}, qkv.storage_offset() + first);
    };
    const at::Tensor q = heads(0, num_heads_), k = heads(q_size, num_kv_heads_),
                     v = heads(q_size + kv_size, num_kv_heads_);
    rotary_(q, k, positions, layer.cos, layer.sin);
    store_kv(k, v, k_caches[index], v_caches[index], slots);
    const at::Tensor attended = attend(q, index, layer.window);
    normed = add_rms_norm_(hidden, linear(attended.reshape({tokens, q_size}), layer, kOProj), layer.mlp_norm, eps_);
    normed = add_rms_norm_(hidden, linear(swiglu(normed, layer), layer, kDown), layer.next_norm, eps_);
  }
  return normed;
}
