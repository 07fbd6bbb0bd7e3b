// A block of 32 features of x rounded to integers for the quantised kernels' integer dot products: each scaled by
// largest_code over the block's largest magnitude and rounded to nearest. A NaN or infinite x makes the block's
// scale (amax / largest_code), and so every output it enters, non-finite.
#pragma once

#include "simd_load.h"

#ifdef VIGIL_AVX2
#include <cstdint>
#include <limits>

namespace vigil {

struct RoundedBlock {
  __m256i codes[4];  // features 0-7, 8-15, 16-23, 24-31 as int32
  float amax;        // the largest magnitude it was rounded against, NaN where that holds one
  float sum;         // of the block's values, for int4's minimums
};

// The largest magnitude of x[0, n), n a multiple of 8; NaN where one of them is. x is fp32 or bf16.
template <typename X>
inline float largest_magnitude(const X* x, int64_t n) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 largest = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = load8(x + i);
    largest = _mm256_max_ps(largest, _mm256_and_ps(v, magnitude));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  // max drops a NaN operand, so NaNs are looked for apart.
  return _mm256_movemask_ps(nan) ? std::numeric_limits<float>::quiet_NaN()
                                 : _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// The block at x rounded against amax: its own largest magnitude, or that of a span of x that holds it.
template <typename X>
inline RoundedBlock round_block(const X* x, float largest_code, float amax) {
  __m256 v[4], sum = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = load8(x + 8 * i);
    sum = _mm256_add_ps(sum, v[i]);
  }
  RoundedBlock block;
  block.amax = amax;
  block.sum = horizontal_sum(sum);
  const __m256 inverse = _mm256_set1_ps(amax > 0.f ? largest_code / amax : 0.f);
  for (int i = 0; i < 4; ++i) block.codes[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
  return block;
}

template <typename X>
inline RoundedBlock round_block(const X* x, float largest_code) {
  return round_block(x, largest_code, largest_magnitude(x, 32));
}

// Features 16 * half to 16 * half + 15 of the block as 16-bit integers, in order.
inline __m256i block_words(const RoundedBlock& block, int half) {
  // packs interleaves the two registers' 128-bit halves; the permute puts the 16 values back in order.
  return _mm256_permute4x64_epi64(_mm256_packs_epi32(block.codes[2 * half], block.codes[2 * half + 1]), 0xD8);
}

}  // namespace vigil
#endif
