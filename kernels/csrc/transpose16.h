// A 16 x 16 matrix of 32-bit elements transposed in AVX-512 registers: the AMX kernels' sums leave tile C, x's rows
// become B tiles, and a column pair's outputs become tile rows through it.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

namespace vigil {

// rows[c] becomes column c of the 16 x 16 matrix of 32-bit elements the rows held.
inline void transpose16(__m512i (&rows)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // Each 128-bit lane L of rows[4i + j] now holds rows 4i to 4i + 3 of column 4L + j.
  for (int i = 0; i < 4; ++i) {
    rows[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    rows[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    rows[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i even_low = _mm512_shuffle_i32x4(rows[j], rows[4 + j], 0x88);
    const __m512i odd_low = _mm512_shuffle_i32x4(rows[j], rows[4 + j], 0xdd);
    const __m512i even_high = _mm512_shuffle_i32x4(rows[8 + j], rows[12 + j], 0x88);
    const __m512i odd_high = _mm512_shuffle_i32x4(rows[8 + j], rows[12 + j], 0xdd);
    t[j] = _mm512_shuffle_i32x4(even_low, even_high, 0x88);
    t[8 + j] = _mm512_shuffle_i32x4(even_low, even_high, 0xdd);
    t[4 + j] = _mm512_shuffle_i32x4(odd_low, odd_high, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(odd_low, odd_high, 0xdd);
  }
  for (int c = 0; c < 16; ++c) rows[c] = t[c];
}

}  // namespace vigil
#endif
