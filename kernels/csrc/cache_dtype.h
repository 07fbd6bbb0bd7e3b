// Calls fn with a value of the C++ type of a KV cache's dtype: fp32, fp16 or bf16.
#pragma once

#include <ATen/ATen.h>

namespace vigil {

template <typename Fn>
void with_cache_type(at::ScalarType type, Fn&& fn) {
  switch (type) {
    case at::kFloat:
      fn(float{});
      break;
    case at::kHalf:
      fn(at::Half{});
      break;
    case at::kBFloat16:
      fn(at::BFloat16{});
      break;
    default:
      TORCH_CHECK(false, "a KV cache is float32, float16 or bfloat16, not ", type);
  }
}

}  // namespace vigil
