// Sixteen outputs' horizontal sums at once. A kernel that ends each output with a vector of partial sums (one
// row of x against one output's weights) reduced it alone, and at SmolLM2's 576 input features that reduction and
// the scalar rounding to bf16 held about a third of the int8 kernel's samples from cache: ~15 instructions an
// output, against ~3 here, where 16 vectors fold into one (lane i the sum of vector i) and round in one store.
#pragma once

#include "simd_load.h"

#if defined(VIGIL_AVX2) && defined(__AVX512F__)
namespace vigil {

// Each 128-bit lane of the result holds two partial sums of a (lanes 0 and 2) and two of b (lanes 1 and 3).
inline __m512 pair_sums(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}

// Of two pair_sums results, ab and cd: each 128-bit lane holds one partial sum of each of the four vectors, in the
// order a, b, c, d.
inline __m512 quad_sums(__m512 ab, __m512 cd) {
  const __m512d ab_pairs = _mm512_castps_pd(ab), cd_pairs = _mm512_castps_pd(cd);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab_pairs, cd_pairs)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(ab_pairs, cd_pairs)));
}

// Lane i of the result is the sum of v[i]'s sixteen lanes, always added in the same order, whichever lane it is.
inline __m512 lane_sums(const __m512 (&v)[16]) {
  __m512 pairs[8];
  for (int i = 0; i < 8; ++i) pairs[i] = pair_sums(v[2 * i], v[2 * i + 1]);
  __m512 quads[4];
  for (int i = 0; i < 4; ++i) quads[i] = quad_sums(pairs[2 * i], pairs[2 * i + 1]);
  // The four 128-bit lanes of each quad added: even lanes to odd, then the two halves.
  const __m512 first = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                     _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 second = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                      _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(first, second, 0x88), _mm512_shuffle_f32x4(first, second, 0xDD));
}

// Lane j of the result is the sum of the j-th vector's sixteen lanes: one quad, its four 128-bit lanes added.
inline __m128 four_lane_sums(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 quad = quad_sums(pair_sums(a, b), pair_sums(c, d));
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(quad), _mm512_extractf32x8_ps(quad, 1));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

// The first `count` lanes of v to y, rounded as a static_cast to T rounds each.
inline void store_lanes(float* y, __m512 v, int64_t count) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << count) - 1), v);
}

inline void store_lanes(at::BFloat16* y, __m512 v, int64_t count) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << count) - 1);
  // To the nearest even, NaN to at::BFloat16's 0x7FC0: what at::BFloat16's conversion does, with AVX-512F alone.
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(y, lanes, _mm512_cvtepi32_epi16(rounded));
}

}  // namespace vigil
#endif
