// Eight cache values widened to fp32 in one AVX2 register, whatever the cache's dtype: fp32 as is, fp16 through
// F16C, bf16 by shifting its 16 bits into the top of each fp32 lane; the sum of a register's lanes; and
// prefetches: of a run of cache lines, and of weight rows ahead of the one being read.
// VIGIL_AVX2 and VIGIL_AVX512_BF16 name the instruction sets this build (-march=native) may use; with the latter,
// 16 bf16 lanes at a time to and from fp32.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VIGIL_AVX2 1
#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>

namespace vigil {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load8(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Kernels that stream weight rows prefetch the bytes this far ahead of the row they read: the hardware
// prefetchers alone kept one stream of rows to 12-14 GB/s on two Xeon cores whose reductions read 22 GB/s; 4 KB
// ahead, 16-18 GB/s.
constexpr int64_t kPrefetchBytes = 4096;

// Prefetches the cache lines of `bytes` from `from`, into the level `Hint` names.
template <int Hint = _MM_HINT_T0>
inline void prefetch_lines(const void* from, int64_t bytes) {
  const char* start = static_cast<const char*>(from);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(start + line, static_cast<_mm_hint>(Hint));
}

// Prefetches `bytes` from kPrefetchBytes past `row`, stopping at `end` (the end of what this thread reads).
inline void prefetch_ahead(const void* row, int64_t bytes, const void* end) {
  const char* from = static_cast<const char*>(row) + kPrefetchBytes;
  prefetch_lines(from, std::min<int64_t>(bytes, static_cast<const char*>(end) - from));
}

inline float horizontal_sum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

}  // namespace vigil
#endif

#if defined(VIGIL_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__)
#define VIGIL_AVX512_BF16 1

namespace vigil {

// Up to 16 bf16 values widened to fp32 (lanes past `lanes` read nothing and are zero), and stored back rounded
// to the nearest even bf16, as at::BFloat16 rounds.
inline __m512 load16(const at::BFloat16* p, __mmask16 lanes = 0xFFFF) {
  return _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm256_maskz_loadu_epi16(lanes, p)));
}

inline void store16(at::BFloat16* p, __m512 v, __mmask16 lanes = 0xFFFF) {
  _mm256_mask_storeu_epi16(p, lanes, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// v rounded to bf16 and widened again: what a value stored in bf16 and read back holds.
inline __m512 round_to_bf16(__m512 v) { return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)); }

}  // namespace vigil
#endif
