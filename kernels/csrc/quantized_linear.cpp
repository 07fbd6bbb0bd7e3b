// Weight-only quantised linear layers for the CPU: y = x · Wᵀ, with W stored as int8 (code * fp32 scale) or packed
// int4 (code * scale + min, both fp16 as in Q4_1) and a scale per group of input features (a group of K is one
// scale per output channel; groups are multiples of 32). x is fp32 or bf16, [M, K]; y has
// x's dtype, [M, N].
//
// A few rows (up to 8; with AVX512-VNNI up to 48, in passes of 8 or fewer) read each output's codes once a pass,
// straight into registers: at batch 1 the step is bound by reading the weights, which are a quarter (int8) or an
// eighth (int4) of their fp32 bytes. Those rows are first rounded to 16-bit integers, a scale per block of 32
// features (or per span of them, where the weights' groups allow: span_rows.h), so that the dot products run as
// integer multiply-adds: int4's as byte multiply-adds, with AVX512-VNNI (every AVX-512 variant, int4_vnni_rows.h)
// or at one row with AVX2 (int4_few_rows.h), the others as 16-bit ones; each feature is then off by at most 2^-16
// of its block's (span's) largest magnitude (llama.cpp rounds to 8 bits). Where the CPU has AMX, rows rounded alike
// take the integer tiles instead: int8 from three rows to 64 (int8_amx_rows.h), int4 from five to 16
// (int4_amx_rows.h), but bf16 rows from four to 64 take int4 dequantised into AMX's bf16 tiles (int4_amx_bf16.h).
// More rows: with AVX2 alone, x rounded to 16-bit integers and 16 outputs' codes widened into a panel of feature
// pairs for 16-bit integer multiply-adds (int16_panels.h); else a task owns 4 output features, dequantises their
// weights (integer times group scale) into an fp32 buffer that stays in L1, a slice of K at a time, and runs every
// row of x against them in 4 rows x 4 outputs of accumulators, each weight loaded once per 4 rows. With
// AVX512-BF16, 49 or more bf16 rows the integer tiles do not take run over the weights dequantised to bf16
// instead: on AMX's bf16 tiles where the CPU has them (dequantised_bf16_linear), else through oneDNN.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "amx_pairs.h"
#include "bf16_row_tiles.h"
#include "compile_time_rows.h"
#include "int16_panels.h"
#include "int4_amx_bf16.h"
#include "int4_amx_rows.h"
#include "int4_few_rows.h"
#include "int4_vnni_rows.h"
#include "int8_amx_rows.h"
#include "int8_vnni_rows.h"
#include "rounded_block.h"
#include "simd_load.h"
#include "span_rows.h"

namespace {

constexpr int64_t kOutputs = 4;   // output features per task
constexpr int64_t kRows = 4;      // rows of x per register tile
constexpr int64_t kSlice = 512;   // input features dequantised at a time: 4 x 512 fp32 = 8 KB
constexpr int64_t kLanes = 8;

constexpr int64_t kBlock = 32;   // input features per packing block; groups are whole blocks

#ifdef VIGIL_AVX2
// The sum over i < n of a[i] * b[i], a in fp16.
inline float dot(const at::Half* a, const float* b, int64_t n) {
  __m256 total = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    total = _mm256_fmadd_ps(vigil::load8(a + i), _mm256_loadu_ps(b + i), total);
  float tail = 0.f;
  for (; i < n; ++i) tail += static_cast<float>(a[i]) * b[i];
  return vigil::horizontal_sum(total) + tail;
}
#endif

// Writes weights [k0, k1) of output row n, dequantised, to dst; k0 and k1 are multiples of kBlock (or K).
struct Int8Rows {
  // Outputs a few-rows task reads side by side at one row. Measured on the 49152 x 576 output layer at one row,
  // weights streamed from memory: one output at a time 1.59 ms, four side by side 3.01 ms (four streams of
  // 576-byte rows read worse than one); on SmolLM2's 30 layers, two side by side took 1.3x one's time.
  static constexpr int64_t kSideBySide = 1;
  const int8_t* w;
  const float* scales;
  int64_t K, groups, group_size;

  const char* codes(int64_t n) const { return reinterpret_cast<const char*>(w + n * K); }
  float scale(int64_t n, int64_t group) const { return scales[n * groups + group]; }
  static constexpr bool kHasMins = false;
  float min(int64_t, int64_t) const { return 0.f; }

  void dequantise(int64_t n, int64_t k0, int64_t k1, float* dst) const {
    const int8_t* row = w + n * K;
    const float* row_scales = scales + n * groups;
    for (int64_t k = k0; k < k1; k += kBlock) {
      const float scale = row_scales[k / group_size];
#ifdef VIGIL_AVX2
      const __m256 s = _mm256_set1_ps(scale);
      for (int64_t i = 0; i < kBlock; i += kLanes) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k + i));
        _mm256_storeu_ps(dst + k - k0 + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s));
      }
#else
      for (int64_t i = 0; i < kBlock; ++i) dst[k - k0 + i] = static_cast<float>(row[k + i]) * scale;
#endif
    }
  }
#ifdef VIGIL_AVX2
  static constexpr int64_t kBlockBytes = kBlock;
  int64_t row_bytes() const { return K; }
  // A block's 32 codes as 16-bit integers: features 0-15 in first, 16-31 in second.
  static void widen(const uint8_t* block, __m256i& first, __m256i& second) {
    first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
  }
  float offset(int64_t, const float*) const { return 0.f; }
#endif
};

// A block of 32 features in 16 bytes, as llama.cpp's Q4_1 lays it out: byte i holds feature i in its low nibble
// and feature i + 16 in its high one, each a code in [0, 15] that stands for code * scale + min of its group.
struct Int4Rows {
  // As for Int8Rows: four side by side 1.05 ms on the output layer, one at a time 2.42 ms (half the bytes a block,
  // and the interleaved chains hide the multiply-adds' latency); two rows take two side by side.
  static constexpr int64_t kSideBySide = 4;
  const uint8_t* w;
  const at::Half* scales;
  const at::Half* mins;
  int64_t K, groups, group_size;

  const char* codes(int64_t n) const { return reinterpret_cast<const char*>(w + n * (K / 2)); }
  float scale(int64_t n, int64_t group) const { return static_cast<float>(scales[n * groups + group]); }
  static constexpr bool kHasMins = true;
  float min(int64_t n, int64_t group) const { return static_cast<float>(mins[n * groups + group]); }

  void dequantise(int64_t n, int64_t k0, int64_t k1, float* dst) const {
    const uint8_t* row = w + n * (K / 2);
    for (int64_t k = k0; k < k1; k += kBlock) {
      const int64_t group = n * groups + k / group_size;
      const float scale = static_cast<float>(scales[group]), min = static_cast<float>(mins[group]);
      const uint8_t* bytes = row + k / 2;
      float* out = dst + k - k0;
#ifdef VIGIL_AVX2
      const __m256 s = _mm256_set1_ps(scale), offset = _mm256_set1_ps(min);
      const __m256i low = _mm256_set1_epi32(0x0F);
      for (int64_t i = 0; i < kBlock / 2; i += kLanes) {
        const __m256i packed = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + i)));
        const __m256 first = _mm256_cvtepi32_ps(_mm256_and_si256(packed, low));
        const __m256 second = _mm256_cvtepi32_ps(_mm256_srli_epi32(packed, 4));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(first, s, offset));
        _mm256_storeu_ps(out + kBlock / 2 + i, _mm256_fmadd_ps(second, s, offset));
      }
#else
      for (int64_t i = 0; i < kBlock / 2; ++i) {
        out[i] = static_cast<float>(bytes[i] & 0x0F) * scale + min;
        out[kBlock / 2 + i] = static_cast<float>(bytes[i] >> 4) * scale + min;
      }
#endif
    }
  }
#ifdef VIGIL_AVX2
  static constexpr int64_t kBlockBytes = kBlock / 2;
  int64_t row_bytes() const { return K / 2; }
  static void widen(const uint8_t* block, __m256i& first, __m256i& second) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    first = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0F));
    second = _mm256_srli_epi16(bytes, 4);
  }
  // The minimums' part of output n: each group's minimum times the sum of x over the group.
  float offset(int64_t n, const float* group_sums) const { return dot(mins + n * groups, group_sums, groups); }
#endif
#ifdef __AVX512F__
  // The same products left in sixteen lanes, for a caller that reduces several outputs' lanes together.
  __m512 offset_lanes(int64_t n, const float* group_sums) const {
    const at::Half* row = mins + n * groups;
    __m512 lanes = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
      const __mmask16 part = vigil::first_lanes(groups - g);
      lanes = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(part, row + g)),
                              _mm512_maskz_loadu_ps(part, group_sums + g), lanes);
    }
    return lanes;
  }
#endif
};

// acc[r][j] += dot(x row (m + r), weights of output j) over one slice; rows beyond M are skipped.
template <typename T>
void tile(const T* x, int64_t ldx, int64_t rows, const float* weights, int64_t len, float acc[kRows][kOutputs]) {
#ifdef VIGIL_AVX2
  if (rows == kRows && len % kLanes == 0) {
    __m256 sums[kRows][kOutputs];
    for (auto& row : sums)
      for (auto& s : row) s = _mm256_setzero_ps();
    for (int64_t k = 0; k < len; k += kLanes) {
      __m256 w[kOutputs];
      for (int64_t j = 0; j < kOutputs; ++j) w[j] = _mm256_loadu_ps(weights + j * kSlice + k);
      for (int64_t r = 0; r < kRows; ++r) {
        const __m256 xv = vigil::load8(x + r * ldx + k);
        for (int64_t j = 0; j < kOutputs; ++j) sums[r][j] = _mm256_fmadd_ps(xv, w[j], sums[r][j]);
      }
    }
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < kOutputs; ++j) acc[r][j] += vigil::horizontal_sum(sums[r][j]);
    return;
  }
  if (len % kLanes == 0) {
    for (int64_t r = 0; r < rows; ++r) {
      __m256 sums[kOutputs];
      for (auto& s : sums) s = _mm256_setzero_ps();
      for (int64_t k = 0; k < len; k += kLanes) {
        const __m256 xv = vigil::load8(x + r * ldx + k);
        for (int64_t j = 0; j < kOutputs; ++j)
          sums[j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(weights + j * kSlice + k), sums[j]);
      }
      for (int64_t j = 0; j < kOutputs; ++j) acc[r][j] += vigil::horizontal_sum(sums[j]);
    }
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kOutputs; ++j) {
      float sum = 0.f;
      for (int64_t k = 0; k < len; ++k) sum += static_cast<float>(x[r * ldx + k]) * weights[j * kSlice + k];
      acc[r][j] += sum;
    }
}

#ifdef VIGIL_AVX2
// Up to 8 rows: with AVX2 alone, on two Zen 3 cores, these took 0.57-0.69x the time of the tiles or panels at 4, 6
// and 8 rows (int8; int4 0.60-0.94x); with AVX512-VNNI, on two Zen 5 cores, SmolLM2's 120 layers in turn took
// 0.43-0.45x the tiles' time at 4 rows, 0.42-0.44x at 6 and 0.51-0.56x at 8 (int8 and int4).
constexpr int64_t kFewRows = 8;
#ifdef __AVX512VNNI__
// Up to this many rows that no AMX tiles take run through the few-rows kernels, in as few passes of up to kFewRows
// rows as cover them, split evenly (nine rows: five, then four): the codes stay integers, where the path past them
// dequantises every weight to bf16 (or fp32) on every call, and oneDNN packs that copy again. SmolLM2's 120 layers
// on two Xeon cores with the avx512_bf16 variant and oneDNN held to AVX512-BF16 (Zen 4's kernels), against the
// dequantised path: int4 0.35x the time at 9 rows, 0.46x at 16, 0.58x at 32, 0.69x at 48; int8 0.29x, 0.32x, 0.41x
// and 0.41x; at 64 rows int4 about 1.0x, int8 0.71-0.74x (the path being memory-bound, relatively cheaper on Zen).
// The avx512 variant's fp32 rows: int4 0.64x at 9 rows to 0.82x at 48, int8 0.59-0.63x. With AVX2 alone the
// 16-bit panels past eight rows were as fast as the passes (0.9-1.0x at 9-16 rows, slower from 24): no passes.
constexpr int64_t kSlicedRows = 48;
#else
constexpr int64_t kSlicedRows = kFewRows;
#endif

// Few rows (decoding a few sequences, or one with its speculative guesses) rounded to 16-bit integers, block-major
// so that one block's rows sit side by side: codes [blocks, R, 32], a scale per block and row [blocks, R], and the
// sum of x over each group [R, groups] (for int4's minimums, from x itself).
struct Int16Rows {
  std::vector<int16_t> codes;
  std::vector<float> scales;
  std::vector<float> group_sums;
};

// A block's scale is its largest magnitude over 32767.
template <typename X>
Int16Rows round_rows(const X* xp, int64_t ldx, int64_t R, int64_t K, int64_t group_size) {
  const int64_t blocks = K / kBlock, groups = K / group_size;
  Int16Rows out{std::vector<int16_t>(R * K), std::vector<float>(R * blocks), std::vector<float>(R * groups, 0.f)};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const vigil::RoundedBlock block = vigil::round_block(xp + r * ldx + b * kBlock, 32767.f);
      int16_t* q = out.codes.data() + (b * R + r) * kBlock;
      for (int half = 0; half < 2; ++half)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16 * half), vigil::block_words(block, half));
      out.scales[b * R + r] = block.amax / 32767.f;
      out.group_sums[r * groups + b * kBlock / group_size] += block.sum;
    }
  return out;
}

// Each task reads S outputs' codes once, widened to 16 bits in registers, and runs every row against them: two
// vpmaddwd a block and row, then one scale (the group's times the row's block's). R and S are compile-time
// constants and every loop over them is unrolled, so that the running totals stay in registers (an array indexed
// by a loop GCC kept on the stack, a store-to-load chain each block), and the blocks are walked group by group
// (a division per block for the group's index cost a quarter of the time at five rows).
template <int64_t R, int64_t S, typename T, typename Rows>
void few_rows_into(const Int16Rows& xq, int64_t K, int64_t N, const Rows& w, T* yp) {
  // Captured values are copied into locals: read through the closure, GCC reloaded them every block.
  at::parallel_for(0, N / S, 16 / S, [&, K, N](int64_t first, int64_t last) {
    const int64_t groups = w.groups, blocks_per_group = w.group_size / kBlock, row_bytes = w.row_bytes();
    const uint8_t* const all_codes = reinterpret_cast<const uint8_t*>(w.w);
    const int16_t* const x_codes = xq.codes.data();
    const float* const x_scales = xq.scales.data();
    const uint8_t* const end = all_codes + last * S * row_bytes;
    for (int64_t task = first; task < last; ++task) {
      const int64_t n0 = task * S;
      const uint8_t* codes = all_codes + n0 * row_bytes;
      vigil::prefetch_ahead(codes, S * row_bytes, end);
      __m256 totals[S][R];
#pragma GCC unroll 4
      for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) totals[j][r] = _mm256_setzero_ps();
      for (int64_t g = 0, b = 0; g < groups; ++g) {
        float group_scales[S];
        for (int64_t j = 0; j < S; ++j) group_scales[j] = w.scale(n0 + j, g);
        for (const int64_t group_end = b + blocks_per_group; b < group_end; ++b) {
          const int16_t* x = x_codes + b * R * kBlock;
          const float* x_scale = x_scales + b * R;
#pragma GCC unroll 4
          for (int64_t j = 0; j < S; ++j) {
            __m256i first_half, second_half;
            Rows::widen(codes + j * row_bytes + b * Rows::kBlockBytes, first_half, second_half);
            const __m256 scale = _mm256_set1_ps(group_scales[j]);
#pragma GCC unroll 8
            for (int64_t r = 0; r < R; ++r) {
              const __m256i* xr = reinterpret_cast<const __m256i*>(x + r * kBlock);
              const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(first_half, _mm256_loadu_si256(xr)),
                                                   _mm256_madd_epi16(second_half, _mm256_loadu_si256(xr + 1)));
              totals[j][r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(x_scale + r)),
                                             scale, totals[j][r]);
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int64_t j = 0; j < S; ++j)
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r)
          yp[r * N + n0 + j] = static_cast<T>(vigil::horizontal_sum(totals[j][r]) +
                                              w.offset(n0 + j, xq.group_sums.data() + r * groups));
    }
  });
}
#endif

#if defined(VIGIL_AVX2) && !defined(__AVX512F__)
// int8 with AVX2 alone, where the weights' groups are long (span_rows.h): a row's sums over a span stay in 32-bit
// integers and take their scales once a span, two multiply-adds and two adds a block and row, where few_rows_into
// also converts, multiplies and adds in fp32 every block.
template <int64_t R, typename T>
void int8_few_rows_in_spans(const vigil::SpanRows& xq, int64_t K, int64_t N, const Int8Rows& w, T* yp) {
  at::parallel_for(0, N, 16, [&, K, N](int64_t first, int64_t last) {
    const int64_t blocks = K / kBlock, blocks_per_group = w.group_size / kBlock;
    const int16_t* const x_codes = xq.codes.data();
    const float* const x_scales = xq.scales.data();
    const uint8_t* const end = reinterpret_cast<const uint8_t*>(w.w) + last * K;
    for (int64_t n = first; n < last; ++n) {
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(w.w) + n * K;
      vigil::prefetch_ahead(codes, K, end);
      alignas(32) float totals[R][kLanes] = {};
      vigil::for_each_span(blocks, blocks_per_group, [&](int64_t span, int64_t begin, int64_t stop, int64_t group) {
        __m256i sums[R];
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
        for (int64_t b = begin; b < stop; ++b) {
          __m256i first_half, second_half;
          Int8Rows::widen(codes + b * kBlock, first_half, second_half);
          const __m256i* x = reinterpret_cast<const __m256i*>(x_codes + b * R * kBlock);
#pragma GCC unroll 8
          for (int64_t r = 0; r < R; ++r) {
            __m256i sum = sums[r];
            vigil::madd_into(sum, first_half, _mm256_loadu_si256(x + 2 * r));
            vigil::madd_into(sum, second_half, _mm256_loadu_si256(x + 2 * r + 1));
            sums[r] = sum;
          }
        }
        const float scale = w.scale(n, group);
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r)
          _mm256_store_ps(totals[r], _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]),
                                                     _mm256_set1_ps(x_scales[span * R + r] * scale),
                                                     _mm256_load_ps(totals[r])));
      });
#pragma GCC unroll 8
      for (int64_t r = 0; r < R; ++r) yp[r * N + n] = static_cast<T>(vigil::horizontal_sum(_mm256_load_ps(totals[r])));
    }
  });
}
#endif

#ifdef VIGIL_AVX2
// One to kFewRows rows of x, each output's codes read once for all of them. x is rounded straight from its dtype:
// a conversion to fp32 first cost 0.65 us a call, 121 calls a step.
template <typename T, typename Rows>
void few_rows_of(const T* xp, int64_t ldx, int64_t M, int64_t K, int64_t N, const Rows& rows_of_w, T* yp) {
  vigil::with_rows<kFewRows>(M, [&](auto rows) {
    constexpr int64_t R = decltype(rows)::value;
    constexpr int64_t S = std::max<int64_t>(1, Rows::kSideBySide / R);
#ifdef __AVX512VNNI__
    if constexpr (std::is_same_v<Rows, Int4Rows>)
      vigil::int4_rows_by_vnni<R, S>(vigil::round_rows_to_split_bytes<4>(xp, ldx, R, K, rows_of_w.group_size), K, N,
                                     rows_of_w, yp);
    else
      vigil::int8_rows_by_vnni<R>(vigil::round_rows_in_spans(xp, ldx, R, K, rows_of_w.group_size), K, N, rows_of_w,
                                  yp);
#else
    if constexpr (std::is_same_v<Rows, Int4Rows> && R == 1) {
      vigil::int4_few_rows_by_bytes<R, S>(vigil::round_rows_to_split_bytes<2>(xp, ldx, R, K, rows_of_w.group_size),
                                          K, N, rows_of_w, yp);
      return;
    }
    if constexpr (std::is_same_v<Rows, Int8Rows>)
      if (vigil::span_blocks_for(rows_of_w) > 1) {
        int8_few_rows_in_spans<R>(vigil::round_rows_in_spans(xp, ldx, R, K, rows_of_w.group_size), K, N, rows_of_w,
                                  yp);
        return;
      }
    few_rows_into<R, S>(round_rows(xp, ldx, R, K, rows_of_w.group_size), K, N, rows_of_w, yp);
#endif
  });
}
#endif

// Whether M rows take the AMX tiles (int8_amx_rows.h, int4_amx_rows.h), which the CPU may lack.
template <typename Rows>
bool rows_take_tiles(int64_t M, int64_t N, int64_t K, const Rows& rows_of_w) {
#if defined(VIGIL_AMX) && defined(__AMX_INT8__)
  if constexpr (std::is_same_v<Rows, Int4Rows>)
    return vigil::int4_tiles_fit(M, N);
  else
    return vigil::int8_tiles_fit(M, N, K, rows_of_w.group_size);
#else
  return false;
#endif
}

template <typename T, typename Rows>
void quantised_linear_into(const at::Tensor& x, const Rows& rows_of_w, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  const T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const int64_t ldx = x.stride(0);
#if defined(VIGIL_AMX) && defined(__AMX_INT8__)
  if (rows_take_tiles(M, N, K, rows_of_w)) {
    if constexpr (std::is_same_v<Rows, Int4Rows>)
      vigil::int4_rows_by_tiles(vigil::round_rows_into_tiles(xp, ldx, M, K, K, rows_of_w.group_size), M, K, N,
                                rows_of_w, yp);
    else
      vigil::int8_rows_by_tiles(
          vigil::round_rows_into_tiles(xp, ldx, M, K, rows_of_w.group_size, rows_of_w.group_size), M, K, N,
          rows_of_w, yp);
    return;
  }
#endif
#ifdef VIGIL_AVX2
  if (M <= kSlicedRows) {
    const int64_t passes = (M + kFewRows - 1) / kFewRows, slice = (M + passes - 1) / passes;
    for (int64_t first = 0; first < M; first += slice)
      few_rows_of(xp + first * ldx, ldx, std::min(slice, M - first), K, N, rows_of_w, yp + first * N);
    return;
  }
#endif
#if defined(VIGIL_AVX2) && !defined(__AVX512F__)
  if (N % vigil::kPanelOutputs == 0) {
    vigil::int16_panels_into(vigil::round_matrix(xp, ldx, M, K, vigil::span_blocks_for(rows_of_w)), M, K, N,
                             rows_of_w, yp);
    return;
  }
#endif
  at::parallel_for(0, N / kOutputs, 1, [&](int64_t first, int64_t last) {
    std::vector<float> weights(kOutputs * kSlice);
    std::vector<float> out(M * kOutputs);
    for (int64_t block = first; block < last; ++block) {
      const int64_t n0 = block * kOutputs;
      std::fill(out.begin(), out.end(), 0.f);
      for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
        const int64_t k1 = std::min(K, k0 + kSlice);
        for (int64_t j = 0; j < kOutputs; ++j) rows_of_w.dequantise(n0 + j, k0, k1, weights.data() + j * kSlice);
        for (int64_t m = 0; m < M; m += kRows) {
          float acc[kRows][kOutputs] = {};
          const int64_t rows = std::min(kRows, M - m);
          tile(xp + m * ldx + k0, ldx, rows, weights.data(), k1 - k0, acc);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < kOutputs; ++j) out[(m + r) * kOutputs + j] += acc[r][j];
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < kOutputs; ++j) yp[m * N + n0 + j] = static_cast<T>(out[m * kOutputs + j]);
    }
  });
}

#ifdef VIGIL_AVX512_BF16
// With AVX512-BF16, a batch of bf16 rows runs faster through oneDNN's bf16 GEMM, over the weights dequantised to
// bf16 for this call only, than through the fp32 tiles above: its dot products do twice the work an instruction.
// Measured on SmolLM2's shapes: the GEMM from 16 rows (375 against 667 us for 3072 x 576; 752 against 2179 at 64
// rows; on two Zen 5 cores, SmolLM2's 120 layers took 10.7 ms at 9 rows against the tiles' 14.1-14.6). It takes
// the rows past kSlicedRows, which the few-rows kernels serve in passes.
constexpr int64_t kDequantisedRows = kSlicedRows + 1;
// A column pair reads its 32 outputs' codes a block at a time, 32 streams the hardware prefetchers do not follow:
// each block is prefetched this many blocks ahead (SmolLM2's 120 layers, int4 at 32 rows: 0.80x the time; int8 and
// int4 at 128 rows 0.86-0.93x; 1 to 4 blocks ahead alike, 8 and 16 less).
constexpr int64_t kPrefetchBlocks = 4;

// A block of 32 weights of output n, dequantised in registers and rounded to bf16 as fp32 would be: the same
// multiply-adds as dequantise(), with no fp32 row between.
inline __m512i dequantised_block_bf16(const Int4Rows& w, int64_t n, int64_t b) {
  const int64_t group = n * w.groups + b * kBlock / w.group_size;
  return vigil::dequantised_codes_bf16(w.w + n * (w.K / 2) + b * kBlock / 2,
                                       vigil::code_values_bf16(_mm512_set1_ps(static_cast<float>(w.scales[group])),
                                                               _mm512_set1_ps(static_cast<float>(w.mins[group]))));
}

inline __m512i dequantised_block_bf16(const Int8Rows& w, int64_t n, int64_t b) {
  const __m512 scale = _mm512_set1_ps(w.scale(n, b * kBlock / w.group_size));
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.w + n * w.K + b * kBlock));
  const __m512 first = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(codes))), scale);
  const __m512 second =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(codes, 1))), scale);
  return (__m512i)_mm512_cvtne2ps_pbh(second, first);
}

template <typename Rows>
at::Tensor dequantised_bf16(const Rows& rows_of_w, int64_t N, int64_t K) {
  auto w = at::empty({N, K}, at::TensorOptions().dtype(at::kBFloat16));
  at::BFloat16* wp = w.data_ptr<at::BFloat16>();
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n)
      for (int64_t b = 0; b < K / kBlock; ++b)
        _mm512_storeu_si512(wp + n * K + b * kBlock, dequantised_block_bf16(rows_of_w, n, b));
  });
  return w;
}

// With AMX, the same bf16 weights on the tiles, with no copy of the layer written out and read back: up to
// kStripsLastRow rows as tile A, 32 outputs a task (bf16_row_tiles.h), past them a column pair at a time as tile B
// (amx_pairs.h), which transposes each weight but then multiplies as the default's bf16 layers do. SmolLM2's 30
// layers on two Emerald Rapids cores, the strips against the column pairs: int4 0.82-0.94x the time at 65 to 192
// rows, 0.99-1.07x at 256 to 512; int8 0.83-0.97x, then 0.96-1.12x. The column pairs took 0.66-0.82x the time of
// oneDNN over a dequantised copy at 9 to 128 rows (1.00x at 512).
constexpr int64_t kStripsLastRow = 192;

template <typename Rows>
at::Tensor dequantised_bf16_linear(const at::Tensor& x, const Rows& rows_of_w, int64_t N) {
#ifdef VIGIL_AMX
  if (vigil::amx::usable()) {
    const auto block = [&](int64_t n, int64_t b) {
      _mm_prefetch(rows_of_w.codes(n) + (b + kPrefetchBlocks) * Rows::kBlockBytes, _MM_HINT_T0);
      return dequantised_block_bf16(rows_of_w, n, b);
    };
    if (x.size(0) <= kStripsLastRow && N % 32 == 0) {
      auto y = at::empty({x.size(0), N}, x.options());
      vigil::rows_by_dequantised_strips(x.data_ptr<at::BFloat16>(), x.stride(0), x.size(0), x.size(1), N, block,
                                        y.data_ptr<at::BFloat16>());
      return y;
    }
    const int64_t blocks = x.size(1) / kBlock;
    return vigil::amx_linear_over_pairs(x, N, [&](int64_t pair, char* stream) {
      vigil::write_pair_stream(pair, N, blocks, block, stream);
    });
  }
#endif
  return at::linear(x, dequantised_bf16(rows_of_w, N, x.size(1)));
}
#endif

template <typename Rows>
at::Tensor quantised_linear(const at::Tensor& x, const Rows& rows_of_w, int64_t N) {
  if (x.size(0) == 0) return at::empty({0, N}, x.options());  // the row kernels take one row at least
#ifdef VIGIL_AMX
  if constexpr (std::is_same_v<Rows, Int4Rows>) {
    if (x.scalar_type() == at::kBFloat16 && vigil::int4_bf16_tiles_fit(x.size(0), N)) {
      auto y = at::empty({x.size(0), N}, x.options());
      vigil::int4_rows_by_bf16_tiles(x.data_ptr<at::BFloat16>(), x.stride(0), x.size(0), x.size(1), N, rows_of_w,
                                     y.data_ptr<at::BFloat16>());
      return y;
    }
  }
#endif
#ifdef VIGIL_AVX512_BF16
  if (x.scalar_type() == at::kBFloat16 && x.size(0) >= kDequantisedRows &&
      !rows_take_tiles(x.size(0), N, x.size(1), rows_of_w))
    return dequantised_bf16_linear(x, rows_of_w, N);
#endif
  auto y = at::empty({x.size(0), N}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    quantised_linear_into<at::BFloat16>(x, rows_of_w, y);
  } else {
    quantised_linear_into<float>(x, rows_of_w, y);
  }
  return y;
}

void check_inputs(const at::Tensor& x, const at::Tensor& scales, at::ScalarType scale_type, int64_t N, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == K, "x must be [tokens, ", K, "], contiguous rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be fp32 or bf16");
  TORCH_CHECK(N % kOutputs == 0, "output features must be a multiple of ", kOutputs);
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == N && scales.is_contiguous() && scales.scalar_type() == scale_type,
              "scales must be ", scale_type, " [N, groups], contiguous");
  TORCH_CHECK(K % kBlock == 0 && K % scales.size(1) == 0 && (K / scales.size(1)) % kBlock == 0,
              "input features and the group size must be multiples of ", kBlock);
}

}  // namespace

at::Tensor int8_linear(at::Tensor x, at::Tensor w, at::Tensor scales) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kChar, "w must be int8 [N, K]");
  const int64_t N = w.size(0), K = w.size(1);
  check_inputs(x, scales, at::kFloat, N, K);
  const int64_t groups = scales.size(1);
  return quantised_linear(x, Int8Rows{w.data_ptr<int8_t>(), scales.data_ptr<float>(), K, groups, K / groups}, N);
}

at::Tensor int4_linear(at::Tensor x, at::Tensor packed, at::Tensor scales, at::Tensor mins) {
  TORCH_CHECK(packed.dim() == 2 && packed.is_contiguous() && packed.scalar_type() == at::kByte,
              "packed must be uint8 [N, K / 2]");
  const int64_t N = packed.size(0), K = 2 * packed.size(1);
  check_inputs(x, scales, at::kHalf, N, K);
  TORCH_CHECK(mins.sizes() == scales.sizes() && mins.is_contiguous() && mins.scalar_type() == at::kHalf,
              "mins must be shaped like scales");
  const int64_t groups = scales.size(1);
  const Int4Rows rows{packed.data_ptr<uint8_t>(), scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>(), K, groups,
                      K / groups};
  return quantised_linear(x, rows, N);
}
