// Small float helpers written so that GCC vectorises loops over them at -O3 without -ffast-math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace vigil {

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

// row[:len] = softmax(row[:len]), in place.
inline void softmax(float* row, int64_t len) {
  constexpr int64_t kLanes = 8;
  const float peak = *std::max_element(row, row + len);
  for (int64_t t = 0; t < len; ++t) row[t] = exp_nonpositive(row[t] - peak);
  float partial[kLanes] = {};
  int64_t t = 0;
  for (; t + kLanes <= len; t += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += row[t + j];
  float total = 0.f;
  for (; t < len; ++t) total += row[t];
  for (int64_t j = 0; j < kLanes; ++j) total += partial[j];
  const float inverse = 1.f / total;
  for (int64_t i = 0; i < len; ++i) row[i] *= inverse;
}

}  // namespace vigil
