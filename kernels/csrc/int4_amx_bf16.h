// int4 weights times four to 64 bf16 rows of x on AMX's bf16 tiles. Each block of 32 features of 16 outputs is
// dequantised in registers (code * scale + min, rounded to bf16, as the prompts' path rounds it) straight into tile A,
// 16 outputs by 32 features in the codes' own order, so nothing is transposed; x is laid out once a call as B tiles
// of bf16 feature pairs, 16 rows a tile, up to four. Q4_1's scale and minimum per 32 features are then in the
// weights, and a task's sums run on in a tile C a row group across every block: where the integer tiles
// (int4_amx_rows.h) store each block's sums and scale them in fp32, twice past eight rows, nothing here is stored or
// added a block.
//
// SmolLM2's 120 layers on two Emerald Rapids cores, weights in L3, against the integer tiles at 9 to 16 rows and
// the bf16 column pairs (amx_pairs.h, which transpose every weight into B) past 16: 0.57-0.58x the time at 9 and 16
// rows (16: 7.1 against 12.4 ms; the default's bf16 tiles take about 10.4), 0.64-0.65x at 24 and 32, 0.68-0.74x at
// 33 to 64, the output layer 0.47-0.58x. At eight rows the first version took 0.96x the integer tiles' time; with
// the codes looked up by one vpermw and x transposed in registers, 0.80-0.84x at five to eight rows and 0.91-0.94x
// the vector kernel's at four (the output layer 0.74-0.81x), but 1.05x at three and twice its time at one and two,
// which keep it. Even and odd blocks summed in two C tiles a row group: no faster.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_pairs.h"
#include "amx_tiles.h"
#include "lane_sums.h"

#ifdef VIGIL_AVX512_BF16
namespace vigil {

// The 16 values a code stands for, code * scale + min rounded to bf16, twice over (vpermw reads five bits of an index).
inline __m512i code_values_bf16(__m512 scale, __m512 min) {
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 values = _mm512_fmadd_ps(codes, scale, min);
  return (__m512i)_mm512_cvtne2ps_pbh(values, values);
}

// A block's 16 bytes of codes (byte i: feature i in its low nibble, i + 16 in its high one) as its 32 weights in
// feature order, looked up in code_values_bf16's table: one vpermw where converting and scaling took six
// instructions (the 120 layers at 9-32 rows 0.94-0.97x the time; the same bits).
inline __m512i dequantised_codes_bf16(const uint8_t* bytes, __m512i values) {
  const __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  // Features 0-15 index by the whole byte, whose bit 4 picks the table's second copy; 16-31 by the high nibble.
  const __m512i indices = _mm512_inserti64x4(_mm512_castsi256_si512(words), _mm256_srli_epi16(words, 4), 1);
  return _mm512_permutexvar_epi16(indices, values);
}

}  // namespace vigil
#endif

#if defined(VIGIL_AMX)
namespace vigil {

constexpr int64_t kBf16TileRowsOfX = 16;
constexpr int64_t kInt4Bf16TilesFirstRow = 4;
constexpr int kMaxRowGroups = 4;  // C tiles, with two for A and two for B
constexpr int64_t kInt4Bf16TilesLastRow = kMaxRowGroups * kBf16TileRowsOfX;

// Whether the bf16 tiles take R bf16 rows against these weights: whole tiles of outputs.
inline bool int4_bf16_tiles_fit(int64_t R, int64_t N) {
  return R >= kInt4Bf16TilesFirstRow && R <= kInt4Bf16TilesLastRow && N % 16 == 0 && amx::usable();
}

// x's bf16 rows as B tiles [row groups of 16, K / 2 feature pairs, 16 rows], each pair one dword; rows past R
// zero. 16 rows' 16 pairs at a time, transposed in registers.
inline std::vector<uint32_t> rows_as_pair_tiles(const at::BFloat16* xp, int64_t ldx, int64_t R, int64_t K) {
  const int64_t row_groups = (R + kBf16TileRowsOfX - 1) / kBf16TileRowsOfX, pairs = K / 2;
  std::vector<uint32_t> tiles(row_groups * pairs * kBf16TileRowsOfX);
  for (int64_t group = 0; group < row_groups; ++group)
    for (int64_t p = 0; p < pairs; p += 16) {
      __m512i block[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = group * kBf16TileRowsOfX + i;
        block[i] = r < R ? _mm512_loadu_si512(xp + r * ldx + 2 * p) : _mm512_setzero_si512();
      }
      transpose16(block);
      for (int64_t j = 0; j < 16; ++j)
        _mm512_storeu_si512(tiles.data() + (group * pairs + p + j) * kBf16TileRowsOfX, block[j]);
    }
  return tiles;
}

// A block's multiplies, its A in tile A: row group g's B in tile 4 or 5 by turns, its sums in tile 0, 1, 6 or 7.
template <int A, int RowGroups>
inline void multiply_row_groups(const uint32_t* x_block, int64_t group_stride) {
  amx::load<4>(x_block, 64);
  amx::multiply<0, A, 4>();
  if constexpr (RowGroups > 1) {
    amx::load<5>(x_block + group_stride, 64);
    amx::multiply<1, A, 5>();
  }
  if constexpr (RowGroups > 2) {
    amx::load<4>(x_block + 2 * group_stride, 64);
    amx::multiply<6, A, 4>();
  }
  if constexpr (RowGroups > 3) {
    amx::load<5>(x_block + 3 * group_stride, 64);
    amx::multiply<7, A, 5>();
  }
}

// A task's sums over every block for each row group, a block's A dequantised a step ahead of its multiply, into
// the other of two slots (tiles 2 and 3).
template <int RowGroups, typename Dequantise>
inline void multiply_blocks(int64_t blocks, const Dequantise& dequantise, const uint32_t* x_tiles,
                            float (&sums)[kMaxRowGroups][16][16]) {
  alignas(64) uint16_t a[2][16][32];
  const int64_t group_stride = blocks * 16 * kBf16TileRowsOfX;
  amx::zero<0>();
  if constexpr (RowGroups > 1) amx::zero<1>();
  if constexpr (RowGroups > 2) amx::zero<6>();
  if constexpr (RowGroups > 3) amx::zero<7>();
  dequantise(0, a[0]);
  for (int64_t b = 0; b < blocks; ++b) {
    if (b + 1 < blocks) dequantise(b + 1, a[(b + 1) % 2]);
    const uint32_t* x_block = x_tiles + b * 16 * kBf16TileRowsOfX;
    if (b % 2 == 0) {
      amx::load<2>(a[0], 64);
      multiply_row_groups<2, RowGroups>(x_block, group_stride);
    } else {
      amx::load<3>(a[1], 64);
      multiply_row_groups<3, RowGroups>(x_block, group_stride);
    }
  }
  amx::store<0>(sums[0], 64);
  if constexpr (RowGroups > 1) amx::store<1>(sums[1], 64);
  if constexpr (RowGroups > 2) amx::store<6>(sums[2], 64);
  if constexpr (RowGroups > 3) amx::store<7>(sums[3], 64);
}

// y[r, n] = x[r] . w[n] for R bf16 rows where int4_bf16_tiles_fit, 16 outputs a task.
template <typename Rows>
void int4_rows_by_bf16_tiles(const at::BFloat16* xp, int64_t ldx, int64_t R, int64_t K, int64_t N, const Rows& w,
                             at::BFloat16* yp) {
  const int64_t blocks = K / 32, groups = w.groups, blocks_per_group = w.group_size / 32, row_bytes = K / 2;
  const int64_t row_groups = (R + kBf16TileRowsOfX - 1) / kBf16TileRowsOfX;
  const std::vector<uint32_t> x_tiles = rows_as_pair_tiles(xp, ldx, R, K);
  at::parallel_for(0, N / 16, 1, [&](int64_t first, int64_t last) {
    // B and C as wide as the rows of a group (zero columns past a later group's last row).
    const int64_t columns = 4 * std::min(R, kBf16TileRowsOfX);
    amx::TileConfig config;
    for (const int c : {0, 1, 6, 7}) config.shape(c, 16, columns);  // C: 16 outputs x the rows, fp32
    config.shape(2, 16, 64);                                         // A: 16 outputs x 32 features, bf16
    config.shape(3, 16, 64);
    config.shape(4, 16, columns);  // B: 16 feature pairs x the rows
    config.shape(5, 16, columns);
    amx::ScopedTiles tiles(config);
    alignas(64) float sums[kMaxRowGroups][16][16];
    std::vector<float> scales(16 * groups), mins(16 * groups);
    const __m512i output_columns =
        _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 4);
    const uint8_t* const end = w.w + last * 16 * row_bytes;
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * 16;
      const uint8_t* codes = w.w + n0 * row_bytes;
      widen_halves(w.scales + n0 * groups, 16 * groups, scales.data());
      widen_halves(w.mins + n0 * groups, 16 * groups, mins.data());
      const auto dequantise = [&](int64_t b, uint16_t(&tile)[16][32]) {
        // The next task's codes, a block's share of them a step.
        prefetch_lines(std::min(codes + 16 * row_bytes + b * 256, end - 256), 256);
        const int64_t g = b / blocks_per_group;
#pragma GCC unroll 16
        for (int64_t j = 0; j < 16; ++j)
          _mm512_store_si512(tile[j], dequantised_codes_bf16(codes + j * row_bytes + b * 16,
                                                             code_values_bf16(_mm512_set1_ps(scales[j * groups + g]),
                                                                              _mm512_set1_ps(mins[j * groups + g]))));
      };
      switch (row_groups) {
        case 1: multiply_blocks<1>(blocks, dequantise, x_tiles.data(), sums); break;
        case 2: multiply_blocks<2>(blocks, dequantise, x_tiles.data(), sums); break;
        case 3: multiply_blocks<3>(blocks, dequantise, x_tiles.data(), sums); break;
        default: multiply_blocks<4>(blocks, dequantise, x_tiles.data(), sums);
      }
      for (int64_t r = 0; r < R; ++r)
        store_lanes(yp + r * N + n0,
                    _mm512_i32gather_ps(output_columns, &sums[r / kBf16TileRowsOfX][0][r % kBf16TileRowsOfX], 4), 16);
    }
  });
}

}  // namespace vigil
#endif
