// int8 weights times one to eight rows of x with AVX512-VNNI: each row rounded in spans (span_rows.h), so that
// vpdpwssd keeps a span's products in 32-bit integer lanes, and a span costs one conversion and one multiply-add a
// row where a scale per block cost them every block.
//
// On two Zen 5 cores, SmolLM2's 120 layers from memory took 0.96-1.00x the time of a scale per block at one row
// (both read the weights at about the memory's speed), 0.90x at two, 0.84x at three, 0.80x at four and 0.74x at
// eight. The bundled model's perplexity through the few-rows path moved from 10.502 to 10.478 (one row a step) and
// from 10.405 to 10.392 (eight).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "compile_time_rows.h"
#include "lane_sums.h"
#include "simd_load.h"
#include "span_rows.h"

#if defined(VIGIL_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
namespace vigil {

// Independent chains of multiply-adds a row at one to three rows, so that a block does not wait on the one before.
constexpr int64_t int8_chains(int64_t rows) { return rows <= 3 ? 2 : 1; }

// y[r, n] for every row; sixteen outputs end together (lane_sums.h). IntoL2: l2_prefetch_pays().
template <int64_t R, bool IntoL2, typename T, typename Rows, int64_t C = int8_chains(R)>
void int8_rows_by_vnni(const SpanRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, blocks_per_group = w.group_size / 32;
  at::parallel_for(0, N, 16, [&, K, N](int64_t first, int64_t last) {
    // Captured values are copied into locals: read through the closure, GCC reloads them every block.
    const int16_t* const x_codes = xq.codes.data();
    const float* const x_scales = xq.scales.data();
    const char* const end = w.codes(last);
    // Output n's sums, one vector a row, kept in registers until they are written to `sums_of_n`.
    const auto sum_output = [&](int64_t n, __m512 (&sums_of_n)[R]) {
      const char* codes = w.codes(n);
      __m512 totals[R];
#pragma GCC unroll 8
      for (int64_t r = 0; r < R; ++r) totals[r] = _mm512_setzero_ps();
      for_each_span(blocks, blocks_per_group, [&](int64_t span, int64_t begin, int64_t stop, int64_t group) {
        __m512i dots[C][R];
#pragma GCC unroll 2
        for (int64_t c = 0; c < C; ++c)
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r) dots[c][r] = _mm512_setzero_si512();
        const auto add_block = [&](int64_t b, __m512i (&chain)[R]) {
          // Prefetched a block at a time, as few_rows_linear.cpp does: a whole row's lines at once stall (one
          // and two rows 5-9% slower).
          // On Intel's mesh L3, slower to answer than Zen's, a line 2 KB ahead into L1 and one 16 KB ahead into
          // L2, where L1 alone reached 4 KB ahead and held one and two rows to about 23 GB/s from L3. SmolLM2's 120
          // layers at one and two rows from L3 on two Emerald Rapids cores: 0.83-0.90x the time, the output layer
          // 0.80-0.88x (on Zen 5 an L2 prefetch cost 1.08-1.11x). Chosen at run time, as for bf16's few rows: the
          // AVX-512 builds without AMX serve Intel's other AVX-512 CPUs too.
          if constexpr (IntoL2) {
            if (b % 2 == 0) prefetch_line_near_and_far<2048, 16384>(codes + b * 32, end);
          } else {
            prefetch_ahead(codes + b * 32, 32, end);
          }
          const __m512i wide = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b * 32)));
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r)
            chain[r] = _mm512_dpwssd_epi32(chain[r], wide, _mm512_loadu_si512(x_codes + (b * R + r) * 32));
        };
        int64_t b = begin;
        for (; b + C <= stop; b += C)
#pragma GCC unroll 2
          for (int64_t c = 0; c < C; ++c) add_block(b + c, dots[c]);
        for (; b < stop; ++b) add_block(b, dots[0]);
        const float weight_scale = w.scale(n, group);
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) {
          __m512i dot = dots[0][r];
#pragma GCC unroll 2
          for (int64_t c = 1; c < C; ++c) dot = _mm512_add_epi32(dot, dots[c][r]);
          totals[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(x_scales[span * R + r] * weight_scale),
                                      totals[r]);
        }
      });
#pragma GCC unroll 8
      for (int64_t r = 0; r < R; ++r) sums_of_n[r] = totals[r];
    };
    for (int64_t n0 = first; n0 < last; n0 += 16) {
      const int64_t count = std::min<int64_t>(16, last - n0);
      __m512 outputs[16][R];
      for (int64_t j = 0; j < 16; ++j) {
        if (j < count) {
          sum_output(n0 + j, outputs[j]);
          continue;
        }
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) outputs[j][r] = _mm512_setzero_ps();
      }
#pragma GCC unroll 8
      for (int64_t r = 0; r < R; ++r) {
        __m512 row[16];
        for (int64_t j = 0; j < 16; ++j) row[j] = outputs[j][r];
        store_lanes(yp + r * N + n0, lane_sums(row), count);
      }
    }
  });
}

template <int64_t R, typename T, typename Rows>
void int8_rows_by_vnni(const SpanRows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  with_flag(l2_prefetch_pays(), [&](auto l2) { int8_rows_by_vnni<R, decltype(l2)::value>(xq, K, N, w, yp); });
}

}  // namespace vigil
#endif
