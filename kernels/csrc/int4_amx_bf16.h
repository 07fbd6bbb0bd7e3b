// int4 weights times four to 64 bf16 rows of x on AMX's bf16 tiles (bf16_row_tiles.h). Each block of 32 features
// of 16 outputs is dequantised in registers (code * scale + min, rounded to bf16, as the prompts' path rounds it)
// straight into tile A, a block ahead of its multiplies, against x's B tiles, 16 rows a tile, up to four. Q4_1's
// scale and minimum per 32 features are then in the weights, and a task's sums run on in a tile C a row group across
// every block: where the integer tiles (int4_amx_rows.h) store each block's sums and scale them in fp32, twice past
// eight rows, nothing here is stored or added a block.
//
// SmolLM2's 120 layers on two Emerald Rapids cores, weights in L3, against the integer tiles at 9 to 16 rows and
// the bf16 column pairs (amx_pairs.h, which transpose every weight into B) past 16: 0.57-0.58x the time at 9 and 16
// rows (16: 7.1 against 12.4 ms; the default's bf16 tiles take about 10.4), 0.64-0.65x at 24 and 32, 0.68-0.74x at
// 33 to 64, the output layer 0.47-0.58x. At eight rows the first version took 0.96x the integer tiles' time; with
// the codes looked up by one vpermw and x transposed in registers, 0.80-0.84x at five to eight rows and 0.91-0.94x
// the vector kernel's at four (the output layer 0.74-0.81x), but 1.05x at three and twice its time at one and two,
// which keep it. Even and odd blocks summed in two C tiles a row group: no faster. The sums transposed in registers
// on their way out, where a gather a row read them, and x's tiles laid out by both threads: 0.85-0.98x the time at
// 4 to 64 rows.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "bf16_row_tiles.h"
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

constexpr int64_t kInt4Bf16TilesFirstRow = 4;
constexpr int64_t kInt4Bf16TilesLastRow = kRowsAPass;

// Whether the bf16 tiles take R bf16 rows against these weights: whole tiles of outputs.
inline bool int4_bf16_tiles_fit(int64_t R, int64_t N) {
  return R >= kInt4Bf16TilesFirstRow && R <= kInt4Bf16TilesLastRow && N % 16 == 0 && amx::usable();
}

// y[r, n] = x[r] . w[n] for R bf16 rows where int4_bf16_tiles_fit, 16 outputs a task, each block's A dequantised
// a block ahead of its multiply into the other of two slots.
template <typename Rows>
void int4_rows_by_bf16_tiles(const at::BFloat16* xp, int64_t ldx, int64_t R, int64_t K, int64_t N, const Rows& w,
                             at::BFloat16* yp) {
  const int64_t blocks = K / 32, groups = w.groups, blocks_per_group = w.group_size / 32, row_bytes = K / 2;
  const int64_t row_groups = (R + kBf16TileRowsOfX - 1) / kBf16TileRowsOfX;
  const std::unique_ptr<uint32_t[]> x_tiles = rows_as_pair_tiles(xp, ldx, R, K);
  at::parallel_for(0, N / 16, 1, [&](int64_t first, int64_t last) {
    amx::ScopedTiles tiles(row_tiles_config(R));
    alignas(64) float sums[kMaxRowGroups][16][16];
    alignas(64) uint16_t a[2][16][32];
    std::vector<float> scales(16 * groups), mins(16 * groups);
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
      const auto a_tile = [&](int64_t b) -> const void* {
        if (b == 0) dequantise(0, a[0]);
        if (b + 1 < blocks) dequantise(b + 1, a[(b + 1) % 2]);
        return a[b % 2];
      };
      multiply_pass(row_groups, blocks, a_tile, x_tiles.get(), sums);
      store_row_sums(sums, R, N, n0, yp);
    }
  });
}

}  // namespace vigil
#endif
