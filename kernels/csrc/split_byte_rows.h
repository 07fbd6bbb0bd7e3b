// Rows of x for the int4 kernels that multiply bytes (int4_few_rows.h with AVX2, int4_vnni_rows.h with
// AVX512-VNNI): each row rounded to 16-bit integers with one scale, and each integer split into a high and a low
// signed byte (x = 256 * high + low), so that byte multiply-adds of the unsigned codes (0-15) against them give the
// very integer dot products 16-bit multiply-adds give.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "compile_time_rows.h"
#include "rounded_block.h"

#ifdef VIGIL_AVX2
namespace vigil {

// The largest integer a block's largest magnitude rounds to: 127 * 256, so that the high byte (x + 128) >> 8 stays
// within a signed byte.
constexpr float kLargestCode = 32512.f;

// Rows rounded and split, Blocks blocks a step (the blocks whose codes one register holds), step-major, then row:
// each row's 64 * Blocks bytes of a step are four parts of 16 * Blocks bytes: the high bytes of the blocks' first
// halves (features 0-15 of block j at byte 16 * j), of their second halves (features 16-31), then the low bytes
// alike. So x meets the codes as they lie (a register's block j in bytes 16j-16j+15, its first half in the low
// nibbles and its second in the high), and no code moves between lanes. A scale per row, the sum of x over each
// group (for the weights' minimums), and each block's group, so that a step's weight scales are found without
// a division. The sum of x over each block too, where a kernel meets the minimums a block at a time. The last step is
// padded with blocks of zeros, in group 0.
template <int64_t Blocks>
struct SplitByteRows {
  static constexpr int64_t kPartBytes = 16 * Blocks;
  static constexpr int64_t kRowBytes = 4 * kPartBytes;
  int64_t steps = 0;
  std::vector<int8_t> codes;          // [steps, R, kRowBytes]
  std::vector<float> row_scales;      // [R]
  std::vector<float> group_sums;      // [R, groups]
  std::vector<float> block_sums;      // [steps, R, Blocks], the sum of x over each block
  std::vector<int32_t> block_groups;  // [steps * Blocks]
};

// A block rounded against kLargestCode as its 32 high signed bytes and its 32 low ones (x = 256 * high + low),
// features in order.
inline void split_block_bytes(const RoundedBlock& block, __m256i& high_bytes, __m256i& low_bytes) {
  __m256i high[2], low[2];
  for (int half = 0; half < 2; ++half) {
    const __m256i words = block_words(block, half);
    high[half] = _mm256_srai_epi16(_mm256_add_epi16(words, _mm256_set1_epi16(128)), 8);
    low[half] = _mm256_sub_epi16(words, _mm256_slli_epi16(high[half], 8));
  }
  // packs interleaves the two registers' 128-bit halves; the permute puts the bytes back in order.
  high_bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(high[0], high[1]), 0xD8);
  low_bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(low[0], low[1]), 0xD8);
}

// f(std::true_type{}) where each group is one block, so that a step's fp16 weight scales lie side by side and load
// as one; else f(std::false_type{}).
template <typename F>
void with_adjacent_scales(int64_t group_size, const F& f) {
  with_flag(group_size == 32, f);
}

// A row's scale is its largest magnitude over kLargestCode.
template <int64_t Blocks, typename X>
SplitByteRows<Blocks> round_rows_to_split_bytes(const X* xp, int64_t ldx, int64_t R, int64_t K,
                                                int64_t group_size) {
  using Rows = SplitByteRows<Blocks>;
  constexpr int64_t kBlock = 32, part = Rows::kPartBytes;
  const int64_t blocks = K / kBlock, groups = K / group_size, steps = (blocks + Blocks - 1) / Blocks;
  Rows out{steps,
           std::vector<int8_t>(steps * R * Rows::kRowBytes, 0),
           std::vector<float>(R),
           std::vector<float>(R * groups, 0.f),
           std::vector<float>(steps * R * Blocks, 0.f),
           std::vector<int32_t>(steps * Blocks, 0)};
  for (int64_t b = 0; b < blocks; ++b) out.block_groups[b] = static_cast<int32_t>(b * kBlock / group_size);
  for (int64_t r = 0; r < R; ++r) {
    const float row_largest = largest_magnitude(xp + r * ldx, K);
    out.row_scales[r] = row_largest / kLargestCode;
    for (int64_t b = 0; b < blocks; ++b) {
      const X* x = xp + r * ldx + b * kBlock;
      const RoundedBlock block = round_block(x, kLargestCode, row_largest);
      __m256i high_bytes, low_bytes;
      split_block_bytes(block, high_bytes, low_bytes);
      const int64_t step = b / Blocks, slot = b % Blocks;
      int8_t* row = out.codes.data() + (step * R + r) * Rows::kRowBytes + 16 * slot;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row), _mm256_castsi256_si128(high_bytes));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + part), _mm256_extracti128_si256(high_bytes, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 2 * part), _mm256_castsi256_si128(low_bytes));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 3 * part), _mm256_extracti128_si256(low_bytes, 1));
      out.group_sums[r * groups + b * kBlock / group_size] += block.sum;
      out.block_sums[(step * R + r) * Blocks + slot] = block.sum;
    }
  }
  return out;
}

}  // namespace vigil
#endif
