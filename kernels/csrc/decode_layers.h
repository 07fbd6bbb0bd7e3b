// Every decoder layer of a step (decoding rows, prompt chunks, or both) in one call from Python, for llama-style
// layers (no biases, no Q/K or output norms, SwiGLU) over bf16 weights, plain or packed for AMX tiles
// (amx_pack_weight), over fp16 weights packed for fbgemm under fp32 compute, or over int8 or int4 weights
// (quantized_linear.cpp). It calls the kernels that server/models/decoder.py calls, in the same order and on the
// same tensors, so its result is the same bits; what it saves is Python's part of each layer (about 7 ms of a
// 48-65 ms decode step at batch 64 on two Xeon cores, 3-5 ms of a 16- to 128-token prompt on AMX).
#pragma once

#include <ATen/ATen.h>
#include <ATen/native/quantized/PackedParams.h>

#include <array>
#include <vector>

using PackedFp16Weight = c10::intrusive_ptr<LinearPackedParamsBase>;

class DecodeLayers {
 public:
  // batch_invariant: as batch-invariant mode's layers, each row summed one way at any batch (bf16 on AMX tiles at
  // every row count, or the row-invariant few-rows kernel).
  DecodeLayers(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t hidden_size,
               int64_t intermediate_size, double eps, double scale, bool batch_invariant);

  // The next layer, given in order: the bf16 weights ([N, K], or packed) of Q/K/V, the output projection, gate/up
  // (gate's rows first) and down; the norm before its MLP and the one after it (the next layer's input norm, or the
  // final norm); its RoPE tables; its attention window (0 for none).
  void add_layer(at::Tensor qkv, at::Tensor o_proj, at::Tensor gate_up, at::Tensor down, at::Tensor mlp_norm,
                 at::Tensor next_norm, at::Tensor cos, at::Tensor sin, int64_t window);

  // The same, for fp32 compute: the four weights are fp16, packed by quantized::linear_prepack_fp16.
  void add_fp16_layer(PackedFp16Weight qkv, PackedFp16Weight o_proj, PackedFp16Weight gate_up, PackedFp16Weight down,
                      at::Tensor mlp_norm, at::Tensor next_norm, at::Tensor cos, at::Tensor sin, int64_t window);

  // The same, over quantised weights: each is the tensors int8_linear (codes, scales) or int4_linear (packed
  // codes, scales, minimums) takes after the activations.
  void add_quantized_layer(std::vector<at::Tensor> qkv, std::vector<at::Tensor> o_proj,
                           std::vector<at::Tensor> gate_up, std::vector<at::Tensor> down, at::Tensor mlp_norm,
                           at::Tensor next_norm, at::Tensor cos, at::Tensor sin, int64_t window);

  // One query token per row of hidden ([tokens, hidden_size], the residual stream, updated in place); normed is its
  // first input norm. The KV caches are the layers' in order. The rest is the step's attention metadata
  // (kernels/backend.py): the first decode_lens.size(0) rows decode, each over its row of decode_tables; the rest
  // are prompt chunks for the paged prefill kernel, sequence i's rows query_starts[i] to query_starts[i + 1] of
  // them, on AMX tiles where prompt_tiles. Returns the last layer's output after the final norm.
  at::Tensor forward(at::Tensor hidden, at::Tensor normed, at::Tensor positions,
                     const std::vector<at::Tensor>& k_caches, const std::vector<at::Tensor>& v_caches,
                     at::Tensor slots, at::Tensor decode_tables, at::Tensor decode_lens, at::Tensor prefill_tables,
                     at::Tensor query_starts, at::Tensor prefill_lens, bool prompt_tiles) const;

 private:
  enum Weight { kQkv, kOProj, kGateUp, kDown };

  struct Layer {
    at::Tensor qkv, o_proj, gate_up, down, mlp_norm, next_norm, cos, sin;
    int64_t window;
    std::array<PackedFp16Weight, 4> fp16;  // in Weight's order, instead of the bf16 ones
    std::array<std::vector<at::Tensor>, 4> quantized;  // likewise
  };

  at::Tensor linear(const at::Tensor& x, const Layer& layer, Weight weight) const;
  at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, int64_t out_features) const;
  at::Tensor swiglu(const at::Tensor& x, const Layer& layer) const;

  int64_t num_heads_, num_kv_heads_, head_dim_, hidden_size_, intermediate_size_;
  double eps_, scale_;
  bool batch_invariant_;
  int64_t few_rows_;
  std::vector<Layer> layers_;
};
