// int8 weights times three to 64 rows of x on AMX tiles. The weights are the A tile as they lie (16 outputs x 64
// codes, a row apart), and x the B tiles (tile_rows.h: each row rounded to 16-bit integers with a scale per span and
// split into a high and a low signed byte, eight rows a tile). One tdpbssd gives 16 outputs' high and low sums over
// 64 features for eight rows at once, where the vector kernel spends a vpdpwssd a row on 32. A span's two sums meet
// in fp32 (256 * high + low), as in int32 they could overflow.
//
// On two Emerald Rapids cores, SmolLM2's 120 layers and its output layer, weights on 2 MB pages and streamed from
// memory, took 0.97-0.99x the vector kernel's time at three rows, 0.90-0.94x at five and 0.79x at eight (output
// layer 0.71-0.95x); with the weights in cache 0.26-0.40x at eight rows. One and two rows keep the vector kernel:
// the tiles took 0.94-1.06x its time there. From nine rows they replace the weights dequantised to bf16 on AMX's bf16
// tiles: the 120 layers took 0.33x that path's time at 12 rows, 0.60x at 32 and 0.82x at 64.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "amx_tiles.h"
#include "lane_sums.h"
#include "span_rows.h"
#include "tile_rows.h"

#if defined(VIGIL_AMX) && defined(__AMX_INT8__)
namespace vigil {

constexpr int64_t kTileFeatures = 64;  // a tile row's codes
constexpr int64_t kTileBytes = 2 * kBlockTileBytes;

constexpr int64_t kInt8TileRows = 64;

// Whether the tiles take R rows against these weights: three to kInt8TileRows rows, whole tiles of outputs and of
// features, and groups of whole tiles.
inline bool int8_tiles_fit(int64_t R, int64_t N, int64_t K, int64_t group_size) {
  return R >= 3 && R <= kInt8TileRows && amx::usable() && N % 16 == 0 && K % kTileFeatures == 0 &&
         group_size % kTileFeatures == 0;
}

// y[r, n] for every row, 16 outputs a task, where int8_tiles_fit. Sixteen rows a pass over the task's codes (which
// stay in L1 from one pass to the next): eight against B and C tiles 2 and 0, the next eight against 4 and 3, both
// with the same A tile.
template <typename T, typename Rows>
void int8_rows_by_tiles(const TileRows& xq, int64_t R, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, blocks_per_group = w.group_size / 32, groups = w.groups;
  const int64_t row_groups = tile_row_groups(R);
  at::parallel_for(0, N / 16, 1, [&, R, K, N](int64_t first, int64_t last) {
    // Past eight rows every tile is as wide as a whole group's: a last group of fewer rows has columns of zeros.
    const int64_t columns = 2 * std::min(R, kTileRowsOfX);
    amx::TileConfig config;
    config.shape(1, 16, 64);  // A: 16 outputs x 64 codes
    for (const int c : {0, 3}) config.shape(c, 16, 4 * columns);  // C: 16 outputs x (high, low) sums of each row
    for (const int b : {2, 4}) config.shape(b, 16, 4 * columns);  // B: 16 runs of four features x their bytes
    amx::ScopedTiles tiles(config);
    const float* const x_scales = xq.scales.data();
    const int8_t* const end = reinterpret_cast<const int8_t*>(w.codes(last * 16));
    const __m512i outputs = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i scale_index = _mm512_mullo_epi32(outputs, _mm512_set1_epi32(static_cast<int32_t>(groups)));
    const __m512i sum_index = _mm512_slli_epi32(outputs, 4);
    alignas(64) int32_t sums[2][16][16];
    __m512 totals[kInt8TileRows];
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * 16;
      const int8_t* codes = reinterpret_cast<const int8_t*>(w.codes(n0));
      for (int64_t r = 0; r < R; ++r) totals[r] = _mm512_setzero_ps();
      for (int64_t pass = 0; pass < row_groups; pass += 2) {
        const bool second_tiles = pass + 1 < row_groups;
        const int8_t* const x_tiles = xq.tiles.data() + pass * blocks * kBlockTileBytes;
        const int8_t* const later_x_tiles = x_tiles + blocks * kBlockTileBytes;
        const int64_t first_row = pass * kTileRowsOfX, end_row = std::min(R, first_row + 2 * kTileRowsOfX);
        for_each_span(blocks, blocks_per_group, [&](int64_t span, int64_t begin, int64_t stop, int64_t group) {
          amx::zero<0>();
          if (second_tiles) amx::zero<3>();
          for (int64_t t = begin / 2; t < stop / 2; ++t) {
            // The next task's rows, a tile's bytes a step: the tiles read 16 rows at once, which the hardware
            // prefetchers follow worse than one (eight rows: 0.96x the time of prefetching 4 KB ahead).
            if (pass == 0) prefetch_lines(std::min(codes + 16 * K + t * kTileBytes, end - kTileBytes), kTileBytes);
            amx::load<1>(codes + t * kTileFeatures, K);
            amx::load<2>(x_tiles + t * kTileBytes, 64);
            amx::multiply_bytes<0, 1, 2>();
            if (second_tiles) {
              amx::load<4>(later_x_tiles + t * kTileBytes, 64);
              amx::multiply_bytes<3, 1, 4>();
            }
          }
          amx::store<0>(sums[0], 64);
          if (second_tiles) amx::store<3>(sums[1], 64);
          const __m512 weight_scales = _mm512_i32gather_ps(scale_index, w.scales + n0 * groups + group, 4);
          for (int64_t r = first_row; r < end_row; ++r) {
            const int32_t* row_sums = &sums[(r - first_row) / kTileRowsOfX][0][2 * (r % kTileRowsOfX)];
            const __m512i high = _mm512_i32gather_epi32(sum_index, row_sums, 4);
            const __m512i low = _mm512_i32gather_epi32(sum_index, row_sums + 1, 4);
            const __m512 dot =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_set1_ps(256.f), _mm512_cvtepi32_ps(low));
            totals[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(weight_scales, _mm512_set1_ps(x_scales[span * R + r])),
                                        totals[r]);
          }
        });
      }
      for (int64_t r = 0; r < R; ++r) store_lanes(yp + r * N + n0, totals[r], 16);
    }
  });
}

}  // namespace vigil
#endif
