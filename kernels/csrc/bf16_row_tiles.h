// bf16 rows of x against weights dequantised into AMX's bf16 tiles a block at a time, in the weights' own order:
// each block of 32 features of 16 outputs is tile A, 16 outputs by 32 features, so nothing is transposed; x is laid
// out once a call as B tiles of bf16 feature pairs, 16 rows a tile, and a task's sums run on in a C tile a row group
// across every block. int4_amx_bf16.h takes int4 from four to 64 rows this way; int8 and int4 from 65 to 192 rows
// take rows_by_dequantised_strips (quantized_linear.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "amx_tiles.h"
#include "compile_time_rows.h"
#include "lane_sums.h"
#include "transpose16.h"

#if defined(VIGIL_AMX)
namespace vigil {

constexpr int64_t kBf16TileRowsOfX = 16;
constexpr int64_t kMaxRowGroups = 4;  // C tiles, with two for A and two for B
constexpr int64_t kRowsAPass = kMaxRowGroups * kBf16TileRowsOfX;

// x's bf16 rows as B tiles [row groups of 16, K / 2 feature pairs, 16 rows], each pair one dword; rows past R
// zero. 16 rows' 16 pairs at a time, transposed in registers, by every thread where there are many, into memory
// left uninitialised (zeroing it first, and transposing on one thread, took a tenth of the time at 512 rows).
inline std::unique_ptr<uint32_t[]> rows_as_pair_tiles(const at::BFloat16* xp, int64_t ldx, int64_t R, int64_t K) {
  const int64_t row_groups = (R + kBf16TileRowsOfX - 1) / kBf16TileRowsOfX, pairs = K / 2, steps = pairs / 16;
  std::unique_ptr<uint32_t[]> tiles(new uint32_t[row_groups * pairs * kBf16TileRowsOfX]);
  at::parallel_for(0, row_groups * steps, 64, [&](int64_t first, int64_t last) {
    for (int64_t unit = first; unit < last; ++unit) {
      const int64_t group = unit / steps, p = unit % steps * 16;
      __m512i block[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = group * kBf16TileRowsOfX + i;
        block[i] = r < R ? _mm512_loadu_si512(xp + r * ldx + 2 * p) : _mm512_setzero_si512();
      }
      transpose16(block);
      for (int64_t j = 0; j < 16; ++j)
        _mm512_storeu_si512(tiles.get() + (group * pairs + p + j) * kBf16TileRowsOfX, block[j]);
    }
  });
  return tiles;
}

// Tiles 0, 1, 6 and 7 hold the sums (four row groups, or two strips by two row groups), 2 and 3 tile A, 4 and 5
// tile B; B and C are as wide as the rows of a group (zero columns past a later group's last row).
inline amx::TileConfig row_tiles_config(int64_t R) {
  const int64_t columns = 4 * std::min(R, kBf16TileRowsOfX);
  amx::TileConfig config;
  for (const int c : {0, 1, 6, 7}) config.shape(c, 16, columns);  // C: 16 outputs x the rows, fp32
  config.shape(2, 16, 64);                                         // A: 16 outputs x 32 features, bf16
  config.shape(3, 16, 64);
  config.shape(4, 16, columns);  // B: 16 feature pairs x the rows
  config.shape(5, 16, columns);
  return config;
}

// A block's multiplies, its A in tile A: row group g's B in tile 4 or 5 by turns, its sums in tile 0, 1, 6 or 7.
template <int A, int64_t RowGroups>
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

// A task's sums over every block for up to four row groups of x_tiles (each `blocks` blocks of 16 pairs long):
// a_tile(b), asked for in order of b, gives block b's A, which tiles 2 and 3 take by turns.
template <int64_t RowGroups, typename ATile>
inline void multiply_blocks(int64_t blocks, const ATile& a_tile, const uint32_t* x_tiles,
                            float (&sums)[kMaxRowGroups][16][16]) {
  const int64_t group_stride = blocks * 16 * kBf16TileRowsOfX;
  amx::zero<0>();
  if constexpr (RowGroups > 1) amx::zero<1>();
  if constexpr (RowGroups > 2) amx::zero<6>();
  if constexpr (RowGroups > 3) amx::zero<7>();
  for (int64_t b = 0; b < blocks; ++b) {
    const void* a = a_tile(b);
    const uint32_t* x_block = x_tiles + b * 16 * kBf16TileRowsOfX;
    if (b % 2 == 0) {
      amx::load<2>(a, 64);
      multiply_row_groups<2, RowGroups>(x_block, group_stride);
    } else {
      amx::load<3>(a, 64);
      multiply_row_groups<3, RowGroups>(x_block, group_stride);
    }
  }
  amx::store<0>(sums[0], 64);
  if constexpr (RowGroups > 1) amx::store<1>(sums[1], 64);
  if constexpr (RowGroups > 2) amx::store<6>(sums[2], 64);
  if constexpr (RowGroups > 3) amx::store<7>(sums[3], 64);
}

// A C tile's sums, [16 outputs][16 rows], to y's first `rows` rows (ldy apart) at their 16 outputs: transposed in
// registers, where a gather a row took longer than the tile's multiplies past 64 rows.
inline void store_transposed(const float (&sums)[16][16], int64_t rows, at::BFloat16* y, int64_t ldy) {
  __m512i lanes[16];
  for (int64_t o = 0; o < 16; ++o) lanes[o] = _mm512_load_si512(sums[o]);
  transpose16(lanes);
  for (int64_t r = 0; r < rows; ++r) store_lanes(y + r * ldy, _mm512_castsi512_ps(lanes[r]), 16);
}

// A pass's sums of `rows` rows (up to 64) for outputs n0 to n0 + 15, into y's rows from yp on.
inline void store_row_sums(const float (&sums)[kMaxRowGroups][16][16], int64_t rows, int64_t N, int64_t n0,
                           at::BFloat16* yp) {
  for (int64_t g = 0; g * kBf16TileRowsOfX < rows; ++g)
    store_transposed(sums[g], std::min(kBf16TileRowsOfX, rows - g * kBf16TileRowsOfX),
                     yp + g * kBf16TileRowsOfX * N + n0, N);
}

// Up to four row groups of x_tiles against one task's blocks, with multiply_blocks' row groups a compile-time count.
template <typename ATile>
inline void multiply_pass(int64_t row_groups, int64_t blocks, const ATile& a_tile, const uint32_t* x_tiles,
                          float (&sums)[kMaxRowGroups][16][16]) {
  with_rows<kMaxRowGroups>(row_groups, [&](auto groups) {
    multiply_blocks<decltype(groups)::value>(blocks, a_tile, x_tiles, sums);
  });
}

// Two strips of 16 outputs against one or two row groups of x_tiles, over every block: a_tiles(b), asked for in
// order of b, gives block b's two A tiles side by side (tiles 2 and 3), and each B (tiles 4 and 5) serves both, so
// that x is read from L2 once for 32 outputs. Strip s and group g sum in tile 0, 1, 6 or 7.
template <int64_t RowGroups, typename ATiles>
inline void multiply_strip_pair(int64_t blocks, const ATiles& a_tiles, const uint32_t* x_tiles,
                                float (&sums)[2][2][16][16]) {
  const int64_t group_stride = blocks * 16 * kBf16TileRowsOfX;
  amx::zero<0>();
  amx::zero<6>();
  if constexpr (RowGroups > 1) {
    amx::zero<1>();
    amx::zero<7>();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const char* a = static_cast<const char*>(a_tiles(b));
    const uint32_t* x_block = x_tiles + b * 16 * kBf16TileRowsOfX;
    amx::load<2>(a, 64);
    amx::load<4>(x_block, 64);
    amx::multiply<0, 2, 4>();
    amx::load<3>(a + 1024, 64);
    amx::multiply<6, 3, 4>();
    if constexpr (RowGroups > 1) {
      amx::load<5>(x_block + group_stride, 64);
      amx::multiply<1, 2, 5>();
      amx::multiply<7, 3, 5>();
    }
  }
  amx::store<0>(sums[0][0], 64);
  amx::store<6>(sums[1][0], 64);
  if constexpr (RowGroups > 1) {
    amx::store<1>(sums[0][1], 64);
    amx::store<7>(sums[1][1], 64);
  }
}

// y[r, n] = x[r] . w[n] for any number of bf16 rows and N a multiple of 32, 32 outputs a task, where
// dequantise(n, b) is output n's weights 32b to 32b + 31 as bf16 (tile A's row). Each task's blocks are
// dequantised once, during its first pass of 32 rows and a block ahead of their multiplies, into a buffer that its
// later passes read again.
template <typename Dequantise>
void rows_by_dequantised_strips(const at::BFloat16* xp, int64_t ldx, int64_t R, int64_t K, int64_t N,
                                const Dequantise& dequantise, at::BFloat16* yp) {
  const int64_t blocks = K / 32, row_groups = (R + kBf16TileRowsOfX - 1) / kBf16TileRowsOfX;
  const int64_t group_stride = blocks * 16 * kBf16TileRowsOfX;
  const std::unique_ptr<uint32_t[]> x_tiles = rows_as_pair_tiles(xp, ldx, R, K);
  at::parallel_for(0, N / 32, 1, [&](int64_t first, int64_t last) {
    amx::ScopedTiles tiles(row_tiles_config(R));
    alignas(64) float sums[2][2][16][16];
    // [blocks][2 strips][16 outputs], a vector a row of tile A
    const std::unique_ptr<__m512i[]> strips(new __m512i[blocks * 32]);
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * 32;
      const auto fill = [&](int64_t b) {
#pragma GCC unroll 16
        for (int64_t j = 0; j < 32; ++j) strips[b * 32 + j] = dequantise(n0 + j, b);
      };
      for (int64_t group = 0; group < row_groups; group += 2) {
        const auto a_tiles = [&](int64_t b) -> const void* {
          if (group == 0) {
            if (b == 0) fill(0);
            if (b + 1 < blocks) fill(b + 1);
          }
          return &strips[b * 32];
        };
        const uint32_t* x_pass = x_tiles.get() + group * group_stride;
        if (group + 1 < row_groups)
          multiply_strip_pair<2>(blocks, a_tiles, x_pass, sums);
        else
          multiply_strip_pair<1>(blocks, a_tiles, x_pass, sums);
        for (int64_t g = group; g < std::min(row_groups, group + 2); ++g)
          for (int64_t s = 0; s < 2; ++s)
            store_transposed(sums[s][g - group], std::min(kBf16TileRowsOfX, R - g * kBf16TileRowsOfX),
                             yp + g * kBf16TileRowsOfX * N + n0 + 16 * s, N);
      }
    }
  });
}

}  // namespace vigil
#endif
