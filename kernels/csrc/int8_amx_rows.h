// int8 weights times three to eight rows of x on AMX tiles. The weights are the A tile as they lie (16 outputs x 64
// codes, a row apart), and x the B tile: each row rounded to 16-bit integers with a scale per span, as
// int8_vnni_rows.h rounds it but against 127 * 256, and split into a high and a low signed byte (x = 256 * high +
// low), column 2r of the tile the high bytes of row r and column 2r + 1 its low ones. One tdpbssd gives 16 outputs'
// high and low sums over 64 features for every row at once, where the vector kernel spends a vpdpwssd a row on 32.
// A span's two sums meet in fp32 (256 * high + low), as in int32 they could overflow.
//
// On two Emerald Rapids cores, SmolLM2's 120 layers and its output layer, weights on 2 MB pages and streamed from
// memory, took 0.97-0.99x the vector kernel's time at three rows, 0.90-0.94x at five and 0.79x at eight (output
// layer 0.71-0.95x); with the weights in cache 0.26-0.40x at eight rows. One and two rows keep the vector kernel:
// the tiles took 0.94-1.06x its time there.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "int8_vnni_rows.h"
#include "lane_sums.h"
#include "split_byte_rows.h"

#if defined(VIGIL_AMX) && defined(__AMX_INT8__)
namespace vigil {

constexpr int64_t kTileFeatures = 64;  // a tile row's codes
constexpr int64_t kTileBytes = 1024;
constexpr int64_t kMaxTileRows = 8;  // rows of x: two columns each in a B tile of 16

// Whether the tiles take R rows against these weights: three rows or more, whole tiles of outputs and of features,
// and groups of whole tiles.
inline bool int8_tiles_fit(int64_t R, int64_t N, int64_t K, int64_t group_size) {
  return R >= 3 && amx::usable() && N % 16 == 0 && K % kTileFeatures == 0 && group_size % kTileFeatures == 0;
}

// x as B tiles, one per 64 features [K / 64, 16 rows of four features, 16 columns of four bytes], and a scale per
// span and row [spans, R].
struct TileRows {
  std::vector<int8_t> tiles;
  std::vector<float> scales;
};

// Spans as int8_vnni_rows.h's, which are whole tiles where groups are.
template <typename X>
TileRows round_rows_into_tiles(const X* xp, int64_t ldx, int64_t R, int64_t K, int64_t group_size) {
  const int64_t blocks = K / 32;
  TileRows out{std::vector<int8_t>(K / kTileFeatures * kTileBytes, 0),
                std::vector<float>(span_count(blocks, group_size / 32) * R)};
  for (int64_t r = 0; r < R; ++r)
    for_each_span(blocks, group_size / 32, [&](int64_t span, int64_t first, int64_t end, int64_t) {
      const X* x = xp + r * ldx;
      const float amax = largest_magnitude(x + first * 32, (end - first) * 32);
      for (int64_t b = first; b < end; ++b) {
        const RoundedBlock block = round_block(x + b * 32, kLargestCode, amax);
        __m256i high_bytes, low_bytes;
        split_block_bytes(block, high_bytes, low_bytes);
        alignas(32) int32_t quads[2][8];  // the block's high bytes, then its low ones, four features an int32
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[0]), high_bytes);
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[1]), low_bytes);
        // Feature f of a tile lies in tile row f / 4, at byte 4 * column + f % 4.
        int8_t* tile = out.tiles.data() + (b / 2) * kTileBytes + (b % 2) * 8 * 64;
        for (int64_t quad = 0; quad < 8; ++quad)
          for (int64_t part = 0; part < 2; ++part)
            std::memcpy(tile + quad * 64 + 4 * (2 * r + part), &quads[part][quad], 4);
      }
      out.scales[span * R + r] = amax / kLargestCode;
    });
  return out;
}

// y[r, n] for every row, 16 outputs a task, where int8_tiles_fit.
template <typename T, typename Rows>
void int8_rows_by_tiles(const TileRows& xq, int64_t R, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, blocks_per_group = w.group_size / 32, groups = w.groups;
  at::parallel_for(0, N / 16, 1, [&, R, K, N](int64_t first, int64_t last) {
    amx::TileConfig config;
    config.shape(0, 16, 8 * R);  // C: 16 outputs x (high, low) sums of each row, in int32
    config.shape(1, 16, 64);     // A: 16 outputs x 64 codes
    config.shape(2, 16, 8 * R);  // B: 16 runs of four features x (high, low) bytes of each row
    amx::ScopedTiles tiles(config);
    const int8_t* const x_tiles = xq.tiles.data();
    const float* const x_scales = xq.scales.data();
    const int8_t* const end = reinterpret_cast<const int8_t*>(w.codes(last * 16));
    const __m512i outputs = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i scale_index = _mm512_mullo_epi32(outputs, _mm512_set1_epi32(static_cast<int32_t>(groups)));
    const __m512i sum_index = _mm512_slli_epi32(outputs, 4);
    alignas(64) int32_t sums[16][16];
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * 16;
      const int8_t* codes = reinterpret_cast<const int8_t*>(w.codes(n0));
      __m512 totals[kMaxTileRows];
      for (int64_t r = 0; r < R; ++r) totals[r] = _mm512_setzero_ps();
      for_each_span(blocks, blocks_per_group, [&](int64_t span, int64_t begin, int64_t stop, int64_t group) {
        amx::zero<0>();
        for (int64_t t = begin / 2; t < stop / 2; ++t) {
          // The next task's rows, a tile's bytes a step: the tiles read 16 rows at once, which the hardware
          // prefetchers follow worse than one (eight rows: 0.96x the time of prefetching 4 KB ahead).
          prefetch_lines(std::min(codes + 16 * K + t * kTileBytes, end - kTileBytes), kTileBytes);
          amx::load<1>(codes + t * kTileFeatures, K);
          amx::load<2>(x_tiles + t * kTileBytes, 64);
          amx::multiply_bytes<0, 1, 2>();
        }
        amx::store<0>(sums, 64);
        const __m512 weight_scales = _mm512_i32gather_ps(scale_index, w.scales + n0 * groups + group, 4);
        for (int64_t r = 0; r < R; ++r) {
          const __m512i high = _mm512_i32gather_epi32(sum_index, &sums[0][2 * r], 4);
          const __m512i low = _mm512_i32gather_epi32(sum_index, &sums[0][2 * r + 1], 4);
          const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_set1_ps(256.f), _mm512_cvtepi32_ps(low));
          totals[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(weight_scales, _mm512_set1_ps(x_scales[span * R + r])),
                                      totals[r]);
        }
      });
      for (int64_t r = 0; r < R; ++r) store_lanes(yp + r * N + n0, totals[r], 16);
    }
  });
}

}  // namespace vigil
#endif
