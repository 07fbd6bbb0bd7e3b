// SiLU(gate) * up on 16 lanes, with torch's roundings for bf16: SiLU rounded to bf16, then the product (rounded
// by the caller's store). The layer op (layer_ops.cpp) and the gate/up kernel (amx_linear.cpp) share it.
#pragma once

#include "simd_load.h"
#include "vector_math.h"

#ifdef VIGIL_AVX512_BF16
namespace vigil {

inline __m512 silu_mul16(__m512 gate, __m512 up) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gate)));
  const __mmask16 positive = _mm512_cmp_ps_mask(gate, _mm512_setzero_ps(), _CMP_GE_OQ);
  // 1 / (1 + e) from the 14-bit reciprocal and one Newton step (about 2^-23): a division costs more than the
  // rest, and the result is rounded to bf16 anyway.
  const __m512 denominator = _mm512_add_ps(one, e), estimate = _mm512_rcp14_ps(denominator);
  const __m512 reciprocal = _mm512_mul_ps(estimate, _mm512_fnmadd_ps(denominator, estimate, _mm512_set1_ps(2.f)));
  const __m512 sigmoid = _mm512_mul_ps(_mm512_mask_blend_ps(positive, e, one), reciprocal);
  return _mm512_mul_ps(round_to_bf16(_mm512_mul_ps(gate, sigmoid)), up);
}

}  // namespace vigil
#endif
