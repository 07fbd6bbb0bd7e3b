// Paged attention with bf16 queries over a bf16 or fp8 cache, where the build has AVX512-BF16: decode
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

inline bool bf16_kernel_cache(at::ScalarType type) {
  return type == at::kBFloat16 || type == at::kFloat8_e4m3fn || type == at::kFloat8_e5m2;
}

// Calls kernel(cache_type) with a value of the cache's C++ type, one of bf16_kernel_cache's.
template <typename Kernel>
void with_bf16_kernel_cache(at::ScalarType type, Kernel&& kernel) {
  switch (type) {
    case at::kFloat8_e4m3fn:
      kernel(at::Float8_e4m3fn{});
      break;
    case at::kFloat8_e5m2:
      kernel(at::Float8_e5m2{});
      break;
    default:
      kernel(at::BFloat16{});
  }
}

// The shapes and dtypes these kernels take.
inline bool bf16_attention_applies(const at::Tensor& q, const at::Tensor& k_cache) {
  return q.scalar_type() == at::kBFloat16 && bf16_kernel_cache(k_cache.scalar_type()) && q.size(2) % 32 == 0 &&
         q.size(2) <= 256 && k_cache.stride(2) % 32 == 0;
}

}  // namespace vigil
#endif
