// The functions of the CPU extension: what bindings.cpp hands to Python, and what decode_layers.cpp calls without
// going through Python.
#pragma once

#include <ATen/ATen.h>

at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                     at::Tensor block_tables, at::Tensor seq_lens, double scale, int64_t window);
at::Tensor paged_prefill_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                                   at::Tensor cu_seqlens_q, at::Tensor seq_lens, double scale, int64_t window,
                                   bool tiles);
void store_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slot_mapping);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor add_rms_norm_(at::Tensor hidden, at::Tensor delta, at::Tensor weight, double eps);
void rotary_(at::Tensor q, at::Tensor k, at::Tensor positions, at::Tensor cos, at::Tensor sin);
at::Tensor silu_mul(at::Tensor gate_up);
at::Tensor int8_linear(at::Tensor x, at::Tensor w, at::Tensor scales);
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor scales, at::Tensor mins);
at::Tensor few_rows_linear(at::Tensor x, at::Tensor w);
at::Tensor row_invariant_linear(at::Tensor x, at::Tensor w);
int64_t few_rows_limit();
at::Tensor amx_pack_weight(at::Tensor w);
bool amx_linear_usable();
at::Tensor amx_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor amx_silu_mul_linear(at::Tensor x, at::Tensor packed, int64_t intermediate);
at::Tensor amx_few_rows_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor greedy_tokens(at::Tensor logits);
