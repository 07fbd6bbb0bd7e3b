// A batch of rows (a prompt) times int8 or int4 weights with AVX2 alone, as integer multiply-adds: x is rounded to
// 16-bit integers with a scale per block of 32 features (as the few-rows kernels round it: each feature off by at
// most 2^-16 of its block's largest magnitude; a slice of 256 for int8 with one scale an output, whose sums then stay
// in integers over the slice), a task widens 16 outputs' codes to 16 bits in a panel laid out by feature pairs (each
// 32-bit lane an output's two features), and a tile of 6 rows broadcasts each row's feature pair against the panel's
// two vectors: one vpmaddwd does 16 multiply-adds where an FMA did 8. Each block's (span's) 12 integer sums then take
// its scales into the rows' fp32 totals, and int4's minimums times the block's sum of x. The fp32 panels it replaced
// dequantised the weights and ran FMAs, at about the FMA units' peak: on two Emerald Rapids cores running this
// variant, SmolLM2's 30 layers at 128 rows took 0.82x their time for int4 and 0.73x for int8.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "compile_time_rows.h"
#include "rounded_block.h"
#include "simd_load.h"
#include "transpose8.h"

#if defined(VIGIL_AVX2) && !defined(__AVX512F__)
namespace vigil {

constexpr int64_t kPanelOutputs = 16;   // two vectors of output lanes
constexpr int64_t kPanelFeatures = 256;  // 16 outputs x 256 features x 2 bytes = 8 KB, in L1
constexpr int64_t kPanelRows = 6;       // rows a register tile: 12 accumulators
constexpr int64_t kPanelBlock = 32;     // features a scale of x and of the weights

// x [M, K] rounded: row-major 16-bit codes, each row's scale of each block, and its sum over each span at the span's
// first block [M, K / 32]. Every block of a span of span_blocks is rounded against the span's largest magnitude.
struct Int16Matrix {
  std::vector<int16_t> codes;
  std::vector<float> scales;
  std::vector<float> sums;
  int64_t span_blocks;
};

template <typename X>
Int16Matrix round_matrix(const X* xp, int64_t ldx, int64_t M, int64_t K, int64_t span_blocks) {
  const int64_t blocks = K / kPanelBlock;
  Int16Matrix out{std::vector<int16_t>(M * K), std::vector<float>(M * blocks), std::vector<float>(M * blocks, 0.f),
                  span_blocks};
  at::parallel_for(0, M, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      for (int64_t span = 0; span < blocks; span += span_blocks) {
        const int64_t end = std::min(blocks, span + span_blocks);
        const float amax = largest_magnitude(xp + r * ldx + span * kPanelBlock, (end - span) * kPanelBlock);
        for (int64_t b = span; b < end; ++b) {
          const RoundedBlock block = round_block(xp + r * ldx + b * kPanelBlock, 32767.f, amax);
          int16_t* codes = out.codes.data() + r * K + b * kPanelBlock;
          for (int half = 0; half < 2; ++half)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 16 * half), block_words(block, half));
          out.scales[r * blocks + b] = amax / 32767.f;
          out.sums[r * blocks + span] += block.sum;
        }
      }
  });
  return out;
}

// A task's weights over one slice of features: the codes by feature pairs [pairs, 16 outputs] (each pair two int16),
// and each block's scales and minimums [blocks, 16 outputs].
struct Int16Panel {
  alignas(32) int16_t rows[kPanelOutputs][kPanelFeatures];  // the codes widened, an output a row, before the transpose
  alignas(32) int32_t pairs[kPanelFeatures / 2][kPanelOutputs];
  alignas(32) float scales[kPanelFeatures / kPanelBlock][kPanelOutputs];
  alignas(32) float mins[kPanelFeatures / kPanelBlock][kPanelOutputs];
};

template <typename Rows>
void pack_int16_panel(const Rows& w, int64_t n0, int64_t k0, int64_t k1, Int16Panel& panel) {
  const int64_t blocks = (k1 - k0) / kPanelBlock;
  for (int64_t j = 0; j < kPanelOutputs; ++j) {
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(w.codes(n0 + j)) + k0 / kPanelBlock * Rows::kBlockBytes;
    for (int64_t b = 0; b < blocks; ++b) {
      __m256i first, second;
      Rows::widen(codes + b * Rows::kBlockBytes, first, second);
      _mm256_store_si256(reinterpret_cast<__m256i*>(&panel.rows[j][b * kPanelBlock]), first);
      _mm256_store_si256(reinterpret_cast<__m256i*>(&panel.rows[j][b * kPanelBlock + 16]), second);
      const int64_t group = (k0 + b * kPanelBlock) / w.group_size;
      panel.scales[b][j] = w.scale(n0 + j, group);
      panel.mins[b][j] = w.min(n0 + j, group);
    }
  }
  // Shuffles only move bits: the int16 pairs travel through them as floats.
  for (int64_t j = 0; j < kPanelOutputs; j += 8)
    for (int64_t p = 0; p < (k1 - k0) / 2; p += 8)
      transpose8(reinterpret_cast<const float*>(&panel.rows[j][2 * p]), kPanelFeatures / 2,
                 reinterpret_cast<float*>(&panel.pairs[p][j]), kPanelOutputs);
}

// acc += the pairs' products of w and x (x in a register or read from memory). In assembly: from the intrinsics GCC
// kept the sums in the products' registers, moving them back each step, and spilled one of eight to the stack.
inline void madd_into(__m256i& acc, __m256i w, __m256i x) {
  __m256i product;
  asm("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(product) : "x"(w), "xm"(x));
}

// out rows [0, R) (16 floats each, ldo apart) += x rows [0, R) times the panel over its blocks, span_blocks of
// them summed in integers before their scales (whose blocks share them). x's codes are the slice's, ldx apart; its
// scales and sums the slice's first block's, ld_blocks apart. The accumulators are named, not an array, so that GCC
// keeps them in registers.
#define VIGIL_INT16_ROWS(APPLY) APPLY(0) APPLY(1) APPLY(2) APPLY(3) APPLY(4) APPLY(5)
template <int64_t R, bool kMins>
void int16_panel_tile(const int16_t* x, int64_t ldx, const float* x_scales, const float* x_sums, int64_t ld_blocks,
                      const Int16Panel& panel, int64_t blocks, int64_t span_blocks, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= kPanelRows);
  for (int64_t b = 0; b < blocks; b += span_blocks) {
    __m256i lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, lo4, hi4, lo5, hi5;
#define VIGIL_ZERO(r)                  \
  if constexpr (R > r) {               \
    lo##r = _mm256_setzero_si256();    \
    hi##r = _mm256_setzero_si256();    \
  }
#define VIGIL_MADD(r)                                                                                    \
  if constexpr (R > r) {                                                                                 \
    const __m256i xr = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x + r * ldx + 2 * p));        \
    madd_into(lo##r, w0, xr);                                                                            \
    madd_into(hi##r, w1, xr);                                                                            \
  }
#define VIGIL_SCALE(r)                                                                                              \
  if constexpr (R > r) {                                                                                            \
    const __m256 scale = _mm256_broadcast_ss(x_scales + r * ld_blocks + b);                                         \
    __m256 y0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo##r), _mm256_mul_ps(scale, _mm256_load_ps(panel.scales[b])), \
                                _mm256_loadu_ps(out + r * ldo));                                                    \
    __m256 y1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi##r),                                                          \
                                _mm256_mul_ps(scale, _mm256_load_ps(panel.scales[b] + 8)),                          \
                                _mm256_loadu_ps(out + r * ldo + 8));                                                \
    if constexpr (kMins) {                                                                                          \
      const __m256 sum = _mm256_broadcast_ss(x_sums + r * ld_blocks + b);                                           \
      y0 = _mm256_fmadd_ps(_mm256_load_ps(panel.mins[b]), sum, y0);                                                 \
      y1 = _mm256_fmadd_ps(_mm256_load_ps(panel.mins[b] + 8), sum, y1);                                             \
    }                                                                                                               \
    _mm256_storeu_ps(out + r * ldo, y0);                                                                            \
    _mm256_storeu_ps(out + r * ldo + 8, y1);                                                                        \
  }
    VIGIL_INT16_ROWS(VIGIL_ZERO)
    for (int64_t p = b * kPanelBlock / 2; p < std::min(blocks, b + span_blocks) * kPanelBlock / 2; ++p) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel.pairs[p]));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel.pairs[p] + 8));
      VIGIL_INT16_ROWS(VIGIL_MADD)
    }
    VIGIL_INT16_ROWS(VIGIL_SCALE)
#undef VIGIL_ZERO
#undef VIGIL_MADD
#undef VIGIL_SCALE
  }
}
#undef VIGIL_INT16_ROWS

// The blocks a span of x: a slice's, where every slice lies in one of the weights' groups (int8's one scale an output),
// else one.
template <typename Rows>
int64_t span_blocks_for(const Rows& w) {
  return w.groups == 1 || w.group_size % kPanelFeatures == 0 ? kPanelFeatures / kPanelBlock : 1;
}

// y [M, N] = x times the weights, where N is a multiple of kPanelOutputs.
template <typename T, typename Rows>
void int16_panels_into(const Int16Matrix& xq, int64_t M, int64_t K, int64_t N, const Rows& w, T* yp) {
  const int64_t ld_blocks = K / kPanelBlock;
  at::parallel_for(0, N / kPanelOutputs, 1, [&](int64_t first, int64_t last) {
    auto panel = std::make_unique<Int16Panel>();
    std::vector<float> out(M * kPanelOutputs);
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * kPanelOutputs;
      std::fill(out.begin(), out.end(), 0.f);
      for (int64_t k0 = 0; k0 < K; k0 += kPanelFeatures) {
        const int64_t k1 = std::min(K, k0 + kPanelFeatures);
        pack_int16_panel(w, n0, k0, k1, *panel);
        for (int64_t m = 0; m < M; m += kPanelRows) {
          with_rows<kPanelRows>(std::min(kPanelRows, M - m), [&](auto rows) {
            int16_panel_tile<decltype(rows)::value, Rows::kHasMins>(
                xq.codes.data() + m * K + k0, K, xq.scales.data() + m * ld_blocks + k0 / kPanelBlock,
                xq.sums.data() + m * ld_blocks + k0 / kPanelBlock, ld_blocks, *panel, (k1 - k0) / kPanelBlock,
                xq.span_blocks, out.data() + m * kPanelOutputs, kPanelOutputs);
          });
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < kPanelOutputs; ++j) yp[m * N + n0 + j] = static_cast<T>(out[m * kPanelOutputs + j]);
    }
  });
}

}  // namespace vigil
#endif
