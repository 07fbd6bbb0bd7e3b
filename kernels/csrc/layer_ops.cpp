// The elementwise parts of a Llama layer for the CPU, each one pass over its rows: RMSNorm (optionally after
// the residual add), rotary embedding in place on the Q/K views of the fused QKV output, and SiLU(gate) * up.
// They compute in fp32 whatever the storage dtype, as the torch versions in kernels/reference.py do.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

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
        for (int64_t d = 0; d < width; ++d)
          row[d] = static_cast<scalar_t>(static_cast<float>(row[d]) + static_cast<float>(extra[d]));
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
          scalar_t* row = base + t * x.stride(0) + h * x.stride(1);
          for (int64_t i = 0; i < half; ++i) {
            const float a = static_cast<float>(row[i]), b = static_cast<float>(row[i + half]);
            row[i] = static_cast<scalar_t>(a * c[i] - b * s[i]);
            row[i + half] = static_cast<scalar_t>(b * c[i + half] + a * s[i + half]);
          }
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
        const scalar_t* up = gate + width;
        scalar_t* row = dst + r * width;
        for (int64_t d = 0; d < width; ++d) {
          // Rounded after SiLU as torch does (F.silu(gate) * up), so half dtypes agree with it.
          const scalar_t activated = static_cast<scalar_t>(vigil::silu(static_cast<float>(gate[d])));
          row[d] = static_cast<scalar_t>(static_cast<float>(activated) * static_cast<float>(up[d]));
        }
      }
    });
  });
  return out;
}
