// Eight cache values widened to fp32 in one AVX2 register, whatever the cache's dtype: fp32 as is, fp16 through
// F16C, bf16 by shifting its 16 bits into the top of each fp32 lane, fp8 through fp16; the sum of a register's
// lanes; and prefetches: of a run of cache lines, and of weight rows ahead of the one being read.
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

// fp8 caches go through fp16, exactly: an e5m2 byte is the top byte of an fp16. An e4m3fn byte sign-extended to 16
// bits and shifted left by 7 holds its sign in bit 15, a copy in bit 14 (cleared), and its exponent and mantissa in
// bits 7-13: an fp16 worth the value times 2^-8, subnormals included (kE4m3HalfScale undoes it). e5m2 bytes come
// zero-extended to 16-bit lanes, e4m3fn bytes sign-extended.
constexpr float kE4m3HalfScale = 256.f;

inline __m128i half_bits(__m128i bytes, at::Float8_e5m2) { return _mm_slli_epi16(bytes, 8); }

inline __m128i half_bits(__m128i bytes, at::Float8_e4m3fn) {
  return _mm_and_si128(_mm_slli_epi16(bytes, 7), _mm_set1_epi16(static_cast<int16_t>(0xBF80)));
}

inline __m256 load8(const at::Float8_e5m2* p) {
  const __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtph_ps(half_bits(bytes, at::Float8_e5m2{}));
}

inline __m256 load8(const at::Float8_e4m3fn* p) {
  const __m128i bytes = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_mul_ps(_mm256_cvtph_ps(half_bits(bytes, at::Float8_e4m3fn{})), _mm256_set1_ps(kE4m3HalfScale));
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

// Prefetches the line `Near` bytes past `line` into L1 and the one `Far` bytes past it into L2, neither at or past
// `end`: from a slow L3, L1's few outstanding misses alone cannot keep a stream of weights coming.
template <int64_t Near, int64_t Far>
inline void prefetch_line_near_and_far(const char* line, const char* end) {
  if (line + Near < end) _mm_prefetch(line + Near, _MM_HINT_T0);
  if (line + Far < end) _mm_prefetch(line + Far, _MM_HINT_T1);
}

// Prefetches `bytes` from kPrefetchBytes past `row`, stopping at `end` (the end of what this thread reads).
inline void prefetch_ahead(const void* row, int64_t bytes, const void* end) {
  const char* from = static_cast<const char*>(row) + kPrefetchBytes;
  prefetch_lines(from, std::min<int64_t>(bytes, static_cast<const char*>(end) - from));
}

// Whether streaming weights pays for a second prefetch, into L2 from further ahead, besides the one into L1: on
// Intel's mesh L3 (two Emerald Rapids cores: the bf16 few-rows kernels 0.63-0.88x the time at one to eight rows),
// not known to on AMD's (on Zen 5 a like prefetch cost int8's kernel 1.08-1.11x), where the kernels keep L1's.
inline bool l2_prefetch_pays() {
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
}

// The lines of `bytes` from `row`: each one kPrefetchBytes ahead into L1 and eight times that ahead into L2, up to
// `end`, as prefetch_line_near_and_far does.
inline void prefetch_ahead_near_and_far(const void* row, int64_t bytes, const void* end) {
  const char* from = static_cast<const char*>(row);
  for (int64_t line = 0; line < bytes; line += 64)
    prefetch_line_near_and_far<kPrefetchBytes, 8 * kPrefetchBytes>(from + line, static_cast<const char*>(end));
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

inline void store16(float* p, __m512 v, __mmask16 lanes = 0xFFFF) { _mm512_mask_storeu_ps(p, lanes, v); }

// `count` (a multiple of 16) fp16 values widened to fp32.
inline void widen_halves(const at::Half* from, int64_t count, float* to) {
  for (int64_t i = 0; i < count; i += 16)
    _mm512_storeu_ps(to + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i))));
}

// v rounded to bf16 and widened again: what a value stored in bf16 and read back holds.
inline __m512 round_to_bf16(__m512 v) { return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)); }

inline __m256i half_bits(__m256i bytes, at::Float8_e5m2) { return _mm256_slli_epi16(bytes, 8); }

inline __m256i half_bits(__m256i bytes, at::Float8_e4m3fn) {
  return _mm256_and_si256(_mm256_slli_epi16(bytes, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
}

// 16 fp8 values widened to fp32.
inline __m512 load16(const at::Float8_e5m2* p) {
  const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(half_bits(bytes, at::Float8_e5m2{}));
}

// 16 cache values widened to fp32 but for a factor, unscaled_factor<T>: a kernel that only adds up multiples of
// them scales the sums instead, once.
template <typename T>
constexpr float unscaled_factor = 1.f;
template <>
constexpr float unscaled_factor<at::Float8_e4m3fn> = kE4m3HalfScale;

template <typename T>
inline __m512 load16_unscaled(const T* p) {
  return load16(p);
}

inline __m512 load16_unscaled(const at::Float8_e4m3fn* p) {
  const __m256i bytes = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(half_bits(bytes, at::Float8_e4m3fn{}));
}

inline __m512 load16(const at::Float8_e4m3fn* p) {
  return _mm512_mul_ps(load16_unscaled(p), _mm512_set1_ps(kE4m3HalfScale));
}

// 32 cache values as the bf16 pairs that vdpbf16ps multiplies; fp8 values are exact in bf16.
inline __m512bh load32_bf16(const at::BFloat16* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }

template <typename Fp8>
inline __m512bh load32_bf16(const Fp8* p) {
  return _mm512_cvtne2ps_pbh(load16(p + 16), load16(p));
}

}  // namespace vigil
#endif
