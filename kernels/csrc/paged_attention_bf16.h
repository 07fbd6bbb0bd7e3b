// Paged attention with bf16 queries over a bf16 cache, where the build has AVX512-BF16: decode
// (paged_decode_bf16.cpp) and prefill (paged_prefill_bf16.cpp). q is [tokens, heads, dim] bf16 with dim a multiple
// of 32 up to 256 and a contiguous last dimension; the result is bf16 like q.
#pragma once

#include <vector>

#include "paged_attention_entry.h"
#include "simd_load.h"

#ifdef VIGIL_AVX512_BF16
namespace vigil {

// One query per sequence; tables and lens int32.
at::Tensor paged_decode_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& tables, const at::Tensor& lens, double scale, int64_t window);

// Each sequence's new tokens, rows cu_seqlens[i]..cu_seqlens[i + 1] of q, are the end of its seq_lens[i] tokens.
at::Tensor paged_prefill_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& tables, const std::vector<int64_t>& cu_seqlens,
                              const std::vector<int64_t>& seq_lens, double scale, int64_t window);

// The shapes these kernels take.
inline bool bf16_attention_applies(const at::Tensor& q, const at::Tensor& k_cache) {
  return q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 && q.size(2) % 32 == 0 &&
         q.size(2) <= 256;
}

}  // namespace vigil
#endif
