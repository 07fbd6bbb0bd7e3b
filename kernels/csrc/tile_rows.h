// Rows of x for the quantised kernels on AMX tiles (int8_amx_rows.h, int4_amx_rows.h): each row rounded to 16-bit
// integers with a scale per span, as span_rows.h rounds it but against 127 * 256, and split into a high and a
// low signed byte (x = 256 * high + low), laid out as B tiles of eight rows each: column 2r the high bytes of the
// tile's row r, column 2r + 1 its low ones, so that one tile multiply gives eight rows' high and low sums at once.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "rounded_block.h"
#include "span_rows.h"
#include "split_byte_rows.h"

#if defined(VIGIL_AVX2) && defined(__AVX512F__)
namespace vigil {

constexpr int64_t kTileRowsOfX = 8;  // rows of x in a B tile: two columns each of 16
constexpr int64_t kBlockTileBytes = 512;  // a block of 32 features: 8 tile rows of four features x 64 bytes

inline int64_t tile_row_groups(int64_t R) { return (R + kTileRowsOfX - 1) / kTileRowsOfX; }

// x as a B tile per eight rows and block of 32 features [row groups, K / 32, 8 rows of four features, 16 columns
// of four bytes], so that two blocks side by side are the B tile of 64 features; a scale per span and row [spans,
// R]; and the sum of x over each group of sum_group_size features [R, groups], for int4's minimums.
struct TileRows {
  std::vector<int8_t> tiles;
  std::vector<float> scales;
  std::vector<float> group_sums;
};

// Spans as span_rows.h's: runs of at most 128 blocks within each group of span_group_size features.
template <typename X>
TileRows round_rows_into_tiles(const X* xp, int64_t ldx, int64_t R, int64_t K, int64_t span_group_size,
                               int64_t sum_group_size) {
  const int64_t blocks = K / 32, sum_groups = K / sum_group_size;
  TileRows out{std::vector<int8_t>(tile_row_groups(R) * blocks * kBlockTileBytes, 0),
               std::vector<float>(span_count(blocks, span_group_size / 32) * R),
               std::vector<float>(R * sum_groups, 0.f)};
  for (int64_t r = 0; r < R; ++r)
    for_each_span(blocks, span_group_size / 32, [&](int64_t span, int64_t first, int64_t end, int64_t) {
      const X* x = xp + r * ldx;
      const float amax = largest_magnitude(x + first * 32, (end - first) * 32);
      for (int64_t b = first; b < end; ++b) {
        const RoundedBlock block = round_block(x + b * 32, kLargestCode, amax);
        __m256i high_bytes, low_bytes;
        split_block_bytes(block, high_bytes, low_bytes);
        alignas(32) int32_t quads[2][8];  // the block's high bytes, then its low ones, four features an int32
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[0]), high_bytes);
        _mm256_store_si256(reinterpret_cast<__m256i*>(quads[1]), low_bytes);
        // Feature f of a block lies in tile row f / 4, at byte 4 * column + f % 4.
        int8_t* tile = out.tiles.data() + (r / kTileRowsOfX * blocks + b) * kBlockTileBytes;
        const int64_t column = 2 * (r % kTileRowsOfX);
        for (int64_t quad = 0; quad < 8; ++quad)
          for (int64_t part = 0; part < 2; ++part)
            std::memcpy(tile + quad * 64 + 4 * (column + part), &quads[part][quad], 4);
        out.group_sums[r * sum_groups + b * 32 / sum_group_size] += block.sum;
      }
      out.scales[span * R + r] = amax / kLargestCode;
    });
  return out;
}

}  // namespace vigil
#endif
