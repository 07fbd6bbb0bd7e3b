// int4 weights times one to eight rows of x with AVX512-VNNI: x rounded and split into bytes four blocks a step
// (split_byte_rows.h), so that one vpdpbusd multiplies 64 codes (0-15) by 64 signed bytes and adds them four by
// four into 32-bit lanes, four lanes a block. A step's 64 bytes of codes are four blocks, and their low and high
// nibbles meet the blocks' first and second halves of x where they lie. Per row and step: four vpdpbusd (both
// nibbles against x's high and low bytes), 256 * high + low, and one multiply-add by the four blocks' weight
// scales, each spread over its block's lanes; from two rows, one more by the blocks' minimums. The fp32 path it
// replaces widened every code to fp32 and issued about twice the instructions per block. x takes one scale a row,
// applied once at the end: with a scale per block, each step also multiplied the weights' scales by the row's, and
// on two Zen 5 cores SmolLM2's 120 layers took 0.93x the time at four rows and 0.96x at eight with the row's scale
// (0.99x at one); the bundled model's perplexity through the one-row path went from 11.205 to 11.148, through
// eight-row steps from 11.146 to 11.078.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <type_traits>

#include "lane_sums.h"
#include "simd_load.h"
#include "split_byte_rows.h"
#include "vector_math.h"

#if defined(VIGIL_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
namespace vigil {

using QuadRows = SplitByteRows<4>;

// The fp16 values a group (the weights' scales or minimums) of one output's row for step q's blocks: with a group a
// block (Adjacent) one 64-bit load, under `mask` for a last step of fewer blocks; else each block's group's.
template <bool Adjacent, bool Masked>
inline __m128 step_values(const at::Half* row, int64_t q, const int32_t* group_index, __mmask8 mask) {
  if constexpr (Adjacent)
    return _mm_cvtph_ps(Masked ? _mm_maskz_loadu_epi16(mask, row + 4 * q)
                               : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 4 * q)));
  else
    return _mm_setr_ps(
        static_cast<float>(row[group_index[4 * q]]), static_cast<float>(row[group_index[4 * q + 1]]),
        static_cast<float>(row[group_index[4 * q + 2]]), static_cast<float>(row[group_index[4 * q + 3]]));
}

// The integer dot products of a block's codes, split into low and high nibbles, with the row's four parts of x (high
// bytes of the blocks' first halves, of their second halves, then the low bytes alike): 256 * high + low, in fp32.
inline __m512 step_sums(__m512i low, __m512i high, const int8_t* x) {
  const __m512i* parts = reinterpret_cast<const __m512i*>(x);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i high_bytes = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, low, _mm512_loadu_si512(parts)), high,
                                                 _mm512_loadu_si512(parts + 1));
  const __m512i low_bytes = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, low, _mm512_loadu_si512(parts + 2)), high,
                                                _mm512_loadu_si512(parts + 3));
  return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(high_bytes, 8), low_bytes));
}

// y[r, n] for S outputs side by side and every row. Adjacent: a group per block, so that a step's four fp16 weight
// scales are one 64-bit load. A last step of fewer than four blocks loads its codes and scales under a mask.
template <int64_t R, int64_t S, bool Adjacent, typename T, typename Rows>
void int4_rows_by_vnni(const QuadRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, groups = w.groups;
  const int64_t full_steps = blocks / 4, tail = blocks % 4;
  // With one row, four outputs side by side: each output's minimums in steps added a load, a conversion and a
  // multiply-add a step to the row's 16 instructions and took longer than a pass over them after the codes (at
  // 1,536 features 1.06-1.11x the time); from two rows the steps share those among the rows.
  constexpr bool kMinimumsInSteps = R > 1;
  static_assert(kMinimumsInSteps || S == 4, "one row reduces four outputs together");
  at::parallel_for(0, N / S, 16 / S, [&, K, N](int64_t first, int64_t last) {
    // Captured values are copied into locals: read through the closure, GCC reloads them every step.
    const int64_t row_bytes = K / 2;
    const uint8_t* const all_codes = w.w;
    const at::Half* const scales = w.scales;
    const at::Half* const mins = w.mins;
    const int8_t* const x_codes = xq.codes.data();
    const float* const x_scales = xq.row_scales.data();
    const float* const x_sums = xq.block_sums.data();
    const int32_t* const group_index = xq.block_groups.data();
    const uint8_t* const end = all_codes + last * S * row_bytes;
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __mmask64 tail_bytes = (uint64_t{1} << (16 * tail)) - 1;
    const __mmask8 tail_scales = static_cast<__mmask8>((1u << tail) - 1);
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * S;
      const uint8_t* codes = all_codes + n0 * row_bytes;
      prefetch_ahead(codes, S * row_bytes, end);
      __m512 totals[S][R];
      __m128 floors[S][R];  // the minimums' share, four blocks' lanes
#pragma GCC unroll 4
      for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) totals[j][r] = _mm512_setzero_ps(), floors[j][r] = _mm_setzero_ps();
      // Every output's scales and minimums are addressed from the task's first output's, a row apart: with a
      // pointer for each output's row of both, GCC ran out of registers and reloaded pointers from the stack
      // every step.
      const at::Half* const scale_rows = scales + n0 * groups;
      const at::Half* const min_rows = mins + n0 * groups;
      const auto add_minimums = [&](int64_t q, const at::Half* min_row, __mmask8 mask, auto masked,
                                    __m128 (&floors_of_j)[R]) {
        if constexpr (kMinimumsInSteps) {
          const __m128 w_min = step_values<Adjacent, decltype(masked)::value>(min_row, q, group_index, mask);
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r)
            floors_of_j[r] = _mm_fmadd_ps(w_min, _mm_loadu_ps(x_sums + (q * R + r) * 4), floors_of_j[r]);
        }
      };
      const auto step = [&](int64_t q, auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        const int8_t* x = x_codes + q * R * QuadRows::kRowBytes;
        const uint8_t* step_codes = codes + 64 * q;
#pragma GCC unroll 4
        for (int64_t j = 0; j < S; ++j) {
          const __m512i bytes = kMasked ? _mm512_maskz_loadu_epi8(tail_bytes, step_codes + j * row_bytes)
                                        : _mm512_loadu_si512(step_codes + j * row_bytes);
          const __m512i low = _mm512_and_si512(bytes, nibble);
          const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
          const __m128 w_scale = step_values<Adjacent, kMasked>(scale_rows + j * groups, q, group_index, tail_scales);
          const __m512 scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(w_scale));
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r)
            totals[j][r] = _mm512_fmadd_ps(step_sums(low, high, x + r * QuadRows::kRowBytes), scale, totals[j][r]);
          add_minimums(q, min_rows + j * groups, tail_scales, masked, floors[j]);
        }
      };
      for (int64_t q = 0; q < full_steps; ++q) step(q, std::false_type{});
      if (tail) step(full_steps, std::true_type{});
      if constexpr (kMinimumsInSteps) {
        // x's scale applied, and the minimums' share added, before the lanes are reduced.
#pragma GCC unroll 4
        for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r)
            yp[r * N + n0 + j] = static_cast<T>(_mm512_reduce_add_ps(_mm512_fmadd_ps(
                totals[j][r], _mm512_set1_ps(x_scales[r]), _mm512_zextps128_ps512(floors[j][r]))));
      } else {
        // The four outputs' sums and their minimums' share (each group's fp16 minimum times the row's group sum)
        // reduced together: output by output, those took about a tenth of a one-row layer (SmolLM2's 120 int4
        // layers 0.94-0.95x the time so, one row).
        const float* group_sums = xq.group_sums.data();
        const __m128 sums = four_lane_sums(totals[0][0], totals[1][0], totals[2][0], totals[3][0]);
        const __m128 offsets = four_lane_sums(w.offset_lanes(n0, group_sums), w.offset_lanes(n0 + 1, group_sums),
                                              w.offset_lanes(n0 + 2, group_sums), w.offset_lanes(n0 + 3, group_sums));
        store_lanes(yp + n0, _mm512_zextps128_ps512(_mm_fmadd_ps(sums, _mm_set1_ps(x_scales[0]), offsets)), 4);
      }
    }
  });
}

template <int64_t R, int64_t S, typename T, typename Rows>
void int4_rows_by_vnni(const QuadRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  with_adjacent_scales(w.group_size, [&](auto adjacent) {
    int4_rows_by_vnni<R, S, decltype(adjacent)::value>(xq, K, N, w, yp);
  });
}

}  // namespace vigil
#endif
