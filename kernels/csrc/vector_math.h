// Small float helpers written so that GCC vectorises loops over them at -O3 without -ffast-math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace vigil {

// What a softmax divided by: its row's largest value, and the sum of exp(x - peak).
struct SoftmaxStats {
  float peak;
  float total;
};

// exp(x) for x <= 0, to about 1 ulp: Cody-Waite range reduction and the Cephes polynomial. Branch-free and
// call-free, so a loop over it vectorises.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float shifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// x * sigmoid(x), from exp(-|x|) so that the exponential never overflows.
inline float silu(float x) {
  const float e = exp_nonpositive(-std::abs(x));
  const float sigmoid = (x >= 0.f ? 1.f : e) / (1.f + e);
  return x * sigmoid;
}

#ifdef __AVX512F__
// The first `count` of 16 lanes (all of them from 16 up).
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

// exp_nonpositive on 16 lanes: the same reduction and polynomial, with fused multiply-adds.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

// row[:len] = softmax(row[:len]), in place, 16 lanes at a time (GCC's own vectorisation kept 8 and a scalar max).
inline SoftmaxStats softmax(float* row, int64_t len) {
  const auto tail = [&](int64_t i) { return first_lanes(len - i); };
  __m512 peak = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < len; i += 16)
    peak = _mm512_mask_max_ps(peak, tail(i), peak, _mm512_maskz_loadu_ps(tail(i), row + i));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < len; i += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail(i), row + i), top));
    _mm512_mask_storeu_ps(row + i, tail(i), e);
    total = _mm512_mask_add_ps(total, tail(i), total, e);
  }
  const float sum = _mm512_reduce_add_ps(total);
  const __m512 inverse = _mm512_set1_ps(1.f / sum);
  for (int64_t i = 0; i < len; i += 16)
    _mm512_mask_storeu_ps(row + i, tail(i), _mm512_mul_ps(_mm512_maskz_loadu_ps(tail(i), row + i), inverse));
  return {_mm512_cvtss_f32(top), sum};
}
#else
// row[:len] = softmax(row[:len]), in place. The peak is taken in eight running maxima, which GCC vectorises:
// std::max_element's one chain of dependent comparisons held 12% of decode attention's time with AVX2.
inline SoftmaxStats softmax(float* row, int64_t len) {
  constexpr int64_t kLanes = 8;
  float peaks[kLanes];
  std::fill(peaks, peaks + kLanes, -std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + kLanes <= len; t += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) peaks[j] = std::max(peaks[j], row[t + j]);
  float peak = *std::max_element(peaks, peaks + kLanes);
  for (; t < len; ++t) peak = std::max(peak, row[t]);
  for (t = 0; t < len; ++t) row[t] = exp_nonpositive(row[t] - peak);
  float partial[kLanes] = {};
  t = 0;
  for (; t + kLanes <= len; t += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += row[t + j];
  float total = 0.f;
  for (; t < len; ++t) total += row[t];
  for (int64_t j = 0; j < kLanes; ++j) total += partial[j];
  const float inverse = 1.f / total;
  for (int64_t i = 0; i < len; ++i) row[i] *= inverse;
  return {peak, total};
}
#endif

}  // namespace vigil
