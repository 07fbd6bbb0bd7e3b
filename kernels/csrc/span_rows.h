// Few rows of x rounded to 16-bit integers with one scale per span of up to 128 blocks (4096 features) of a weight
// group, so that a row's products over a span add up in 32-bit integer lanes and take their scales once a span.
// 16 bits a feature over a span: a feature is off by at most half a step, the span's largest magnitude / 65534,
// against int8 weights off by up to a channel's largest / 254.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rounded_block.h"
#include "simd_load.h"

#ifdef VIGIL_AVX2
namespace vigil {

// A block adds at most 2 * 32767 * 128 to a lane of vpdpwssd's 16 (two features each), and twice that to a lane of
// AVX2's eight (two vpmaddwd of two features each): over 128 blocks 2,147,418,112, within int32 either way.
constexpr int64_t kSpanBlocks = 128;

// Rows rounded in spans: codes block-major, so that one block's rows lie side by side [blocks, R, 32], and a scale
// per span and row [spans, R].
struct SpanRows {
  std::vector<int16_t> codes;
  std::vector<float> scales;
};

// f(span, first block, end block, group) for each group's blocks in runs of at most kSpanBlocks.
template <typename F>
void for_each_span(int64_t blocks, int64_t blocks_per_group, const F& f) {
  int64_t span = 0;
  for (int64_t group = 0, first = 0; first < blocks; ++group)
    for (const int64_t group_end = first + blocks_per_group; first < group_end;) {
      const int64_t end = std::min(first + kSpanBlocks, group_end);
      f(span++, first, end, group);
      first = end;
    }
}

inline int64_t span_count(int64_t blocks, int64_t blocks_per_group) {
  int64_t spans = 0;
  for_each_span(blocks, blocks_per_group, [&](int64_t, int64_t, int64_t, int64_t) { ++spans; });
  return spans;
}

// A span's scale is its largest magnitude over 32767; a NaN in it makes the scale NaN.
template <typename X>
SpanRows round_rows_in_spans(const X* xp, int64_t ldx, int64_t R, int64_t K, int64_t group_size) {
  const int64_t blocks = K / 32;
  SpanRows out{std::vector<int16_t>(R * K), std::vector<float>(span_count(blocks, group_size / 32) * R)};
  for (int64_t r = 0; r < R; ++r)
    for_each_span(blocks, group_size / 32, [&](int64_t span, int64_t first, int64_t end, int64_t) {
      const X* x = xp + r * ldx;
      const float amax = largest_magnitude(x + first * 32, (end - first) * 32);
      for (int64_t b = first; b < end; ++b) {
        const RoundedBlock block = round_block(x + b * 32, 32767.f, amax);
        for (int half = 0; half < 2; ++half)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.codes.data() + (b * R + r) * 32 + 16 * half),
                              block_words(block, half));
      }
      out.scales[span * R + r] = amax / 32767.f;
    });
  return out;
}

}  // namespace vigil
#endif
