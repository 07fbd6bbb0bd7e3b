// int4 weights times five to 16 rows of x on AMX tiles (bf16 rows take int4_amx_bf16.h instead: fp32 rows these). Each block
// of 32 features is a tile multiply of its own, as each has its weight scale: the 16 outputs' codes, unpacked from
// nibbles to bytes, are tile A (16 outputs x 32 unsigned codes), and x the B tile (tile_rows.h: each row's high and low
// signed bytes, eight rows a tile); one tdpbusd gives 16 outputs' high and low integer sums over the block for eight
// rows at once, where the vector kernel (int4_rows_by_vnni) spends four vpdpbusd a row on four blocks of one output.
// Each output's sums then take the block's weight scale in fp32, and at the end of a span x's scales, 256 times the
// row's for the high bytes.
//
// Each block pays a fixed cost (unpacking, a tile store, 16 multiply-adds of its sums) whatever the rows: on two
// Emerald Rapids cores SmolLM2's 120 layers, weights streamed from memory, took 1.15-1.3x the vector kernel's time
// at three and four rows (which keep it), 0.91-0.97x at five, 0.67-0.74x at eight (output layer 0.48-0.60x), and
// 0.55-0.65x the time of the weights dequantised to bf16 at nine to 16 rows. Unpacking a step ahead of the
// multiply and adding the sums a step behind it, on two sets of tiles, took 0.78-0.87x the time of doing each in turn.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_tiles.h"
#include "lane_sums.h"
#include "tile_rows.h"

#if defined(VIGIL_AMX) && defined(__AMX_INT8__)
namespace vigil {

// Steps between a block's unpacking and its multiply, and between its multiply and the adding of its sums.
constexpr int64_t kBlockLag = 2;
constexpr int64_t kBlockSlots = 2 * kBlockLag;

constexpr int64_t kInt4TileRows = 16;

// Whether the tiles take R rows against these weights: five to kInt4TileRows rows, and whole tiles of outputs.
inline bool int4_tiles_fit(int64_t R, int64_t N) {
  return R >= 5 && R <= kInt4TileRows && amx::usable() && N % 16 == 0;
}

// A block's 16 bytes of codes for each of 16 outputs, row_bytes apart, as tile A's rows of 32 codes in feature
// order: byte i holds feature i in its low nibble and feature i + 16 in its high one.
inline void unpack_block_codes(const uint8_t* codes, int64_t row_bytes, uint8_t (&tile)[16][32]) {
  const __m256i nibbles = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xF0)), _mm_set1_epi8(0x0F));
  const __m256i shifts = _mm256_set_m128i(_mm_set1_epi16(4), _mm_setzero_si128());
#pragma GCC unroll 16
  for (int64_t j = 0; j < 16; ++j) {
    const __m256i bytes =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j * row_bytes)));
    // A 16-bit shift moves no bits between bytes here: each byte's low nibble is already cleared.
    _mm256_store_si256(reinterpret_cast<__m256i*>(tile[j]), _mm256_srlv_epi16(_mm256_and_si256(bytes, nibbles), shifts));
  }
}

// A block's sums: tile C = A (16 outputs' codes) x B (x's bytes), stored.
template <int C, int A, int B>
inline void block_product(const uint8_t (&codes)[16][32], const int8_t* x_tile, int32_t (&sums)[16][16]) {
  amx::load<A>(codes, 32);
  amx::load<B>(x_tile, 64);
  amx::zero<C>();
  amx::multiply_unsigned_bytes<C, A, B>();
  amx::store<C>(sums, 64);
}

// y[r, n] for every row, 16 outputs a task, where int4_tiles_fit; xq rounded in spans of the whole row, its group
// sums over the weights' groups. Eight rows at a time: each eight take one B tile and one pass over the task's codes
// (which stay in L1 from one pass to the next).
template <typename T, typename Rows>
void int4_rows_by_tiles(const TileRows& xq, int64_t R, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t blocks = K / 32, groups = w.groups, blocks_per_group = w.group_size / 32, row_bytes = K / 2;
  const int64_t spans = static_cast<int64_t>(xq.scales.size()) / R, row_groups = tile_row_groups(R);
  // x's scales spread over the columns each row's sums land in, 256 times the row's for its high bytes:
  // [row groups, spans, 16].
  std::vector<float> column_scales(row_groups * spans * 16, 0.f);
  for (int64_t span = 0; span < spans; ++span)
    for (int64_t r = 0; r < R; ++r) {
      float* columns = column_scales.data() + ((r / kTileRowsOfX) * spans + span) * 16 + 2 * (r % kTileRowsOfX);
      columns[0] = 256.f * xq.scales[span * R + r];
      columns[1] = xq.scales[span * R + r];
    }
  at::parallel_for(0, N / 16, 1, [&, R, K, N](int64_t first, int64_t last) {
    // Every row group's tiles as wide as the first's: a last group of fewer rows has columns of zeros.
    const int64_t columns = 2 * std::min(R, kTileRowsOfX);
    amx::TileConfig config;
    for (int set = 0; set < 2; ++set) {
      config.shape(3 * set, 16, 4 * columns);      // C: 16 outputs x (high, low) sums of each row, in int32
      config.shape(3 * set + 1, 16, 32);           // A: 16 outputs x a block's 32 codes
      config.shape(3 * set + 2, 8, 4 * columns);   // B: 8 runs of four features x (high, low) bytes of each row
    }
    amx::ScopedTiles tiles(config);
    alignas(64) uint8_t codes_tiles[kBlockSlots][16][32];
    alignas(64) int32_t sums[kBlockSlots][16][16] = {};  // columns past the tiles' stay zero
    alignas(64) float totals[16][16];
    std::vector<float> weight_scales(16 * groups), weight_mins(16 * groups), mins_by_group(groups * 16);
    const __m512i outputs = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i output_groups = _mm512_mullo_epi32(outputs, _mm512_set1_epi32(static_cast<int32_t>(groups)));
    const __m512i output_columns = _mm512_slli_epi32(outputs, 4);
    const uint8_t* const end = w.w + last * 16 * row_bytes;
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * 16;
      const uint8_t* codes = w.w + n0 * row_bytes;
      // The 16 outputs' scales and minimums lie side by side, an output's groups in a run.
      widen_halves(w.scales + n0 * groups, 16 * groups, weight_scales.data());
      widen_halves(w.mins + n0 * groups, 16 * groups, weight_mins.data());
      for (int64_t g = 0; g < groups; ++g)
        _mm512_storeu_ps(mins_by_group.data() + g * 16, _mm512_i32gather_ps(output_groups, weight_mins.data() + g, 4));
      const auto unpack = [&](int64_t b, uint8_t(&tile)[16][32]) {
        // The next task's codes, a block's share of them a step.
        prefetch_lines(std::min(codes + 16 * row_bytes + b * 256, end - 256), 256);
        unpack_block_codes(codes + b * 16, row_bytes, tile);
      };
      for (int64_t row_group = 0; row_group < row_groups; ++row_group) {
        const int8_t* const x_tiles = xq.tiles.data() + row_group * blocks * kBlockTileBytes;
        for (auto& row : totals) _mm512_store_ps(row, _mm512_setzero_ps());
        for_each_span(blocks, blocks, [&](int64_t span, int64_t begin, int64_t stop, int64_t) {
          __m512 acc[16];
#pragma GCC unroll 16
          for (int64_t j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
          const auto add_block = [&](const int32_t(&block_sums)[16][16], int64_t b) {
            const float* block_scales = weight_scales.data() + b / blocks_per_group;
#pragma GCC unroll 16
            for (int64_t j = 0; j < 16; ++j)
              acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(block_sums[j])),
                                       _mm512_set1_ps(block_scales[j * groups]), acc[j]);
          };
          // Blocks in flight on two sets of tiles: a block's codes are unpacked kBlockLag steps before its multiply,
          // and its sums added kBlockLag steps after, so that neither waits on the stores before it.
          for (int64_t b = begin - kBlockLag; b < stop + kBlockLag; ++b) {
            if (b + kBlockLag < stop) unpack(b + kBlockLag, codes_tiles[(b + kBlockLag - begin) % kBlockSlots]);
            if (b >= begin && b < stop) {
              const int64_t slot = (b - begin) % kBlockSlots;
              if (slot % 2 == 0)
                block_product<0, 1, 2>(codes_tiles[slot], x_tiles + b * kBlockTileBytes, sums[slot]);
              else
                block_product<3, 4, 5>(codes_tiles[slot], x_tiles + b * kBlockTileBytes, sums[slot]);
            }
            if (b - kBlockLag >= begin) add_block(sums[(b - kBlockLag - begin) % kBlockSlots], b - kBlockLag);
          }
          const __m512 x_scales = _mm512_loadu_ps(column_scales.data() + (row_group * spans + span) * 16);
#pragma GCC unroll 16
          for (int64_t j = 0; j < 16; ++j)
            _mm512_store_ps(totals[j], _mm512_fmadd_ps(acc[j], x_scales, _mm512_load_ps(totals[j])));
        });
        // Each row's high and low totals of the 16 outputs, and the minimums' part: each group's minimum times
        // the sum of x over the group.
        for (int64_t r = row_group * kTileRowsOfX; r < std::min(R, (row_group + 1) * kTileRowsOfX); ++r) {
          const int64_t column = 2 * (r % kTileRowsOfX);
          __m512 y = _mm512_add_ps(_mm512_i32gather_ps(output_columns, &totals[0][column], 4),
                                   _mm512_i32gather_ps(output_columns, &totals[0][column + 1], 4));
          const float* group_sums = xq.group_sums.data() + r * groups;
          for (int64_t g = 0; g < groups; ++g)
            y = _mm512_fmadd_ps(_mm512_loadu_ps(mins_by_group.data() + g * 16), _mm512_set1_ps(group_sums[g]), y);
          store_lanes(yp + r * N + n0, y, 16);
        }
      }
    }
  });
}

}  // namespace vigil
#endif
