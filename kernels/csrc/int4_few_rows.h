// int4 weights times a few rows of x with AVX2 alone (no AVX512-VNNI): each row rounded and split into bytes
// (split_byte_rows.h), so that vpmaddubsw, which multiplies 32 unsigned codes (0-15) by 32 signed bytes and adds
// them in pairs, gives the very integer dot products 16-bit multiply-adds give. Two blocks are read at once:
// their 32 bytes of codes hold the low and high halves of both, and x is laid out to meet them as they lie, so
// that no code moves between lanes, and a pair's two weight scales are applied in one multiply-add. x takes one
// scale a row, applied once at the end, as in int4_vnni_rows.h: against a scale a block (each pair's weight scales
// multiplied by the row's every step), SmolLM2's 120 layers on the Xeon's avx2 variant took 0.98-0.99x the time,
// the output layer 0.97x, one layer in cache 0.96-0.99x; int4 perplexity at one token a step 11.1638 -> 11.1658.
//
// It serves one row, a single stream's decode step. On two Zen 3 cores, SmolLM2's four layer shapes, each measured
// alternately with the 16-bit path 15 times: 0.79-0.88x its time at one row, 0.93-0.98x at two, 0.88-1.14x at
// four, 1.00-1.15x at eight; the model's 120 layers in turn, from memory, 0.87x. 8-bit rows alone (llama.cpp's
// Q8 activations) were faster still (0.57-0.76x) but cost quality: through the few-rows path (a chunked prefill
// of 8 tokens) the bundled model's int4 perplexity rose from 11.128 to 11.808, against 10.367 unquantised.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#include "simd_load.h"
#include "split_byte_rows.h"

#ifdef VIGIL_AVX2
namespace vigil {

using BytePairRows = SplitByteRows<2>;

// A block's 16 bytes of codes against its x: the integer dot product of 32 features.
inline __m128i block_dot(__m128i codes, const int8_t* x) {
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i low = _mm_and_si128(codes, nibble), high = _mm_and_si128(_mm_srli_epi16(codes, 4), nibble);
  const auto half_dot = [&](const int8_t* bytes) {
    return _mm_add_epi16(_mm_maddubs_epi16(low, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))),
                         _mm_maddubs_epi16(high, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 32))));
  };
  return _mm_add_epi32(_mm_madd_epi16(half_dot(x), _mm_set1_epi16(256)),
                       _mm_madd_epi16(half_dot(x + 64), _mm_set1_epi16(1)));
}

// The odd last block of a row of codes, whose pair is padded with zeros: its 16 bytes in one 128-bit step, times
// its weight scale (x's scale is the caller's, as for the pairs).
inline float last_block(const BytePairRows& xq, int64_t R, int64_t r, const uint8_t* codes,
                        const at::Half* row_scales) {
  const int64_t pair = xq.steps - 1, block = 2 * pair;
  __m128i sum = block_dot(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * block)),
                          xq.codes.data() + (pair * R + r) * 128);
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1));
  return static_cast<float>(_mm_cvtsi128_si32(sum)) * static_cast<float>(row_scales[xq.block_groups[block]]);
}

// y[r, n] for S outputs side by side and every row, as few_rows_into does with 16-bit rows. A pair of blocks per
// step: their 32 bytes of codes split into low and high nibbles (two ands and a shift), four vpmaddubsw (high and
// low bytes of x), and the two blocks' weight scales spread over the lanes each block's sums landed in. Adjacent:
// a group per block, so that a pair's two fp16 weight scales are read as one 32-bit load.
template <int64_t R, int64_t S, bool Adjacent, typename T, typename Rows>
void int4_few_rows_by_bytes(const BytePairRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, groups = w.groups;
  const int64_t full_pairs = blocks / 2;
  at::parallel_for(0, N / S, 16 / S, [&, K, N](int64_t first, int64_t last) {
    const int64_t row_bytes = K / 2;
    const uint8_t* const all_codes = reinterpret_cast<const uint8_t*>(w.w);
    const at::Half* const scales = w.scales;
    const int8_t* const x_codes = xq.codes.data();
    const float* const x_scales = xq.row_scales.data();
    const int32_t* const group_index = xq.block_groups.data();
    const uint8_t* const end = all_codes + last * S * row_bytes;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1), times256 = _mm256_set1_epi16(256);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * S;
      const uint8_t* codes = all_codes + n0 * row_bytes;
      prefetch_ahead(codes, S * row_bytes, end);
      __m256 totals[S][R];
#pragma GCC unroll 4
      for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) totals[j][r] = _mm256_setzero_ps();
      for (int64_t p = 0; p < full_pairs; ++p) {
        const int8_t* x = x_codes + p * R * 128;
#pragma GCC unroll 4
        for (int64_t j = 0; j < S; ++j) {
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * row_bytes + 32 * p));
          const __m256i low = _mm256_and_si256(bytes, nibble);
          const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
          const at::Half* row_scales = scales + (n0 + j) * groups;
          const __m128 w_scale =
              Adjacent ? _mm_cvtph_ps(_mm_loadu_si32(row_scales + 2 * p))
                       : _mm_setr_ps(static_cast<float>(row_scales[group_index[2 * p]]),
                                     static_cast<float>(row_scales[group_index[2 * p + 1]]), 0.f, 0.f);
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r) {
            const __m256i* xr = reinterpret_cast<const __m256i*>(x + r * 128);
            const __m256i high_bytes = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_loadu_si256(xr)),
                                                        _mm256_maddubs_epi16(high, _mm256_loadu_si256(xr + 1)));
            const __m256i low_bytes = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_loadu_si256(xr + 2)),
                                                       _mm256_maddubs_epi16(high, _mm256_loadu_si256(xr + 3)));
            const __m256 sums = _mm256_cvtepi32_ps(
                _mm256_add_epi32(_mm256_madd_epi16(high_bytes, times256), _mm256_madd_epi16(low_bytes, ones)));
            totals[j][r] = _mm256_fmadd_ps(sums, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(w_scale), spread),
                                           totals[j][r]);
          }
        }
      }
#pragma GCC unroll 4
      for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) {
          float total = horizontal_sum(totals[j][r]);
          if (blocks % 2) total += last_block(xq, R, r, codes + j * row_bytes, scales + (n0 + j) * groups);
          yp[r * N + n0 + j] =
              static_cast<T>(total * x_scales[r] + w.offset(n0 + j, xq.group_sums.data() + r * groups));
        }
    }
  });
}

template <int64_t R, int64_t S, typename T, typename Rows>
void int4_few_rows_by_bytes(const BytePairRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  with_adjacent_scales(w.group_size, [&](auto adjacent) {
    int4_few_rows_by_bytes<R, S, decltype(adjacent)::value>(xq, K, N, w, yp);
  });
}

}  // namespace vigil
#endif
