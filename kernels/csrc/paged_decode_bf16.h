// Decode attention with bf16 queries over a bf16 cache, where the build has AVX512-BF16.
#pragma once

#include "paged_attention_entry.h"
#include "simd_load.h"

#ifdef VIGIL_AVX512_BF16
namespace vigil {

// q [seqs, heads, dim] bf16 with dim a multiple of 32 up to 256; tables and lens int32; returns bf16 like q.
at::Tensor paged_decode_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& tables, const at::Tensor& lens, double scale, int64_t window);

}  // namespace vigil
#endif
