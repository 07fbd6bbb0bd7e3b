// The elementwise parts of a Llama layer for the CPU, each one pass over its rows: RMSNorm (optionally after
// the residual add), rotary embedding in place on the Q/K views of the fused QKV output, and SiLU(gate) * up.
// They compute in fp32 whatever the storage dtype, as the torch versions in kernels/reference.py do; bf16 rows go
// 16 lanes at a time where the CPU has AVX512-BF16.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "silu_mul.h"
#include "simd_load.h"
#include "vector_math.h"

namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kRowsPerTask = 4;

template <typename T>
void normalise_row(const T* x, const T* weight, T* out, int64_t width, float eps) {
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      const float v = static_cast<float>(x[i + j]);
      partial[j] += v * v;
    }
  float squares = 0.f;
  for (; i < width; ++i) squares += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  for (int64_t j = 0; j < kLanes; ++j) squares += partial[j];
  const float inverse = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
  for (int64_t d = 0; d < width; ++d) {
    // As Hugging Face does: normalise in fp32, round to the storage dtype, then scale.
    const T normalised = static_cast<T>(static_cast<float>(x[d]) * inverse);
    out[d] = static_cast<T>(static_cast<float>(weight[d]) * static_cast<float>(normalised));
  }
}

// One row's residual add: row = row + extra, rounded to the storage dtype.
template <typename T>
void add_row(T* row, const T* extra, int64_t width) {
  for (int64_t d = 0; d < width; ++d) row[d] = static_cast<T>(static_cast<float>(row[d]) + static_cast<float>(extra[d]));
}

// SiLU(gate) * up over one row.
template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t width) {
  for (int64_t d = 0; d < width; ++d) {
    // Rounded after SiLU as torch does (F.silu(gate) * up), so half dtypes agree with it.
    const T activated = static_cast<T>(vigil::silu(static_cast<float>(gate[d])));
    out[d] = static_cast<T>(static_cast<float>(activated) * static_cast<float>(up[d]));
  }
}

// Rotate-half RoPE of one head's row, in place.
template <typename T>
void rotate_row(T* row, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = static_cast<float>(row[i]), b = static_cast<float>(row[i + half]);
    row[i] = static_cast<T>(a * c[i] - b * s[i]);
    row[i + half] = static_cast<T>(b * c[i + half] + a * s[i + half]);
  }
}

#ifdef VIGIL_AVX512_BF16
// The same four in 16 bf16 lanes at a time, with the same roundings (GCC does not vectorise the bf16 casts).
using bf16 = at::BFloat16;

void normalise_row(const bf16* x, const bf16* weight, bf16* out, int64_t width, float eps) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < width; i += 16) {
    const __m512 v = vigil::load16(x + i, vigil::first_lanes(width - i));
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const __m512 inverse =
      _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(width) + eps));
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 lanes = vigil::first_lanes(width - i);
    const __m512 normalised = vigil::round_to_bf16(_mm512_mul_ps(vigil::load16(x + i, lanes), inverse));
    vigil::store16(out + i, _mm512_mul_ps(vigil::load16(weight + i, lanes), normalised), lanes);
  }
}

void add_row(bf16* row, const bf16* extra, int64_t width) {
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 lanes = vigil::first_lanes(width - i);
    vigil::store16(row + i, _mm512_add_ps(vigil::load16(row + i, lanes), vigil::load16(extra + i, lanes)), lanes);
  }
}

void silu_mul_row(const bf16* gate, const bf16* up, bf16* out, int64_t width) {
  for (int64_t i = 0; i < width; i += 16) {
    const __mmask16 lanes = vigil::first_lanes(width - i);
    vigil::store16(out + i, vigil::silu_mul16(vigil::load16(gate + i, lanes), vigil::load16(up + i, lanes)), lanes);
  }
}

void rotate_row(bf16* row, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 lanes = vigil::first_lanes(half - i);
    const __m512 a = vigil::load16(row + i, lanes), b = vigil::load16(row + i + half, lanes);
    const auto table = [&](const float* t) { return _mm512_maskz_loadu_ps(lanes, t); };
    vigil::store16(row + i, _mm512_fmsub_ps(a, table(c + i), _mm512_mul_ps(b, table(s + i))), lanes);
    vigil::store16(row + i + half, _mm512_fmadd_ps(b, table(c + i + half), _mm512_mul_ps(a, table(s + i + half))),
                   lanes);
  }
}
#endif

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rows must be [tokens, width] with contiguous width");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1), "weight is [width]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and rows must share a dtype");
}

}  // namespace

at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, weight);
  auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t rows = x.size(0), width = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        normalise_row(src + r * x.stride(0), w, dst + r * width, width, static_cast<float>(eps));
    });
  });
  return out;
}

// hidden += delta in place; returns rms_norm(hidden).
at::Tensor add_rms_norm_(at::Tensor hidden, at::Tensor delta, at::Tensor weight, double eps) {
  check_rows(hidden, weight);
  TORCH_CHECK(hidden.is_contiguous() && delta.sizes() == hidden.sizes() && delta.stride(1) == 1,
              "hidden must be contiguous and delta of its shape");
  TORCH_CHECK(delta.scalar_type() == hidden.scalar_type(), "delta and hidden must share a dtype");
  auto out = at::empty_like(hidden);
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, hidden.scalar_type(), "add_rms_norm_", [&] {
    scalar_t* h = hidden.data_ptr<scalar_t>();
    const scalar_t* add = delta.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = h + r * width;
        const scalar_t* extra = add + r * delta.stride(0);
        add_row(row, extra, width);
        normalise_row(row, w, dst + r * width, width, static_cast<float>(eps));
      }
    });
  });
  return out;
}

// x * cos + rotate_half(x) * sin, in place, for x = [tokens, heads, head_dim] with a contiguous head_dim;
// cos and sin are fp32 [positions, head_dim] tables whose two halves repeat.
void rotate_in_place(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
                     const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x is [tokens, heads, head_dim] with contiguous head_dim");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* cos_ptr = cos.data_ptr<float>();
  const float* sin_ptr = sin.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rotary", [&] {
    scalar_t* base = x.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* c = cos_ptr + pos[t] * dim;
        const float* s = sin_ptr + pos[t] * dim;
        for (int64_t h = 0; h < heads; ++h) {
          rotate_row(base + t * x.stride(0) + h * x.stride(1), c, s, half);
        }
      }
    });
  });
}

void rotary_(at::Tensor q, at::Tensor k, at::Tensor positions, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos and sin tables are fp32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == q.size(2), "tables are [pos, dim]");
  TORCH_CHECK(q.size(2) % 2 == 0 && k.size(2) == q.size(2), "q and k share an even head_dim");
  auto pos = positions.to(at::kLong).contiguous();
  TORCH_CHECK(pos.numel() == q.size(0) && pos.numel() == k.size(0), "one position per token");
  rotate_in_place(q, pos, cos, sin);
  rotate_in_place(k, pos, cos, sin);
}

// [tokens, 2 * width] -> SiLU(first half) * second half.
at::Tensor silu_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "gate_up is [tokens, 2 * width] with a contiguous last dim");
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = at::empty({rows, width}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* src = gate_up.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gate = src + r * gate_up.stride(0);
        silu_mul_row(gate, gate + width, dst + r * width, width);
      }
    });
  });
  return out;
}
