// Writes each new token's keys and values into its slot of the paged KV cache (slot = block * block_size +
// offset); slot -1 marks a token to skip. The rows of k and v may be strided views of a fused QKV output.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

// Rows are copied as bytes, so every cache dtype (fp8 included) takes the same copy.
void copy_rows(const at::Tensor& src, at::Tensor& cache, const int64_t* slots) {
  const int64_t tokens = src.size(0), heads = src.size(1), element = src.element_size();
  const int64_t row_bytes = src.size(2) * element;
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(cache.data_ptr());
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(to + (slot * heads + h) * row_bytes, from + (t * src.stride(0) + h * src.stride(1)) * element,
                    row_bytes);
    }
  });
}

}  // namespace

void store_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slot_mapping) {
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes(), "k and v are [tokens, kv_heads, dim]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == k.size(1) &&
                  k_cache.size(3) == k.size(2),
              "the caches are [blocks, block_size, kv_heads, dim] with k's heads and dim");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the KV caches must be contiguous");
  TORCH_CHECK(slot_mapping.numel() == k.size(0), "one slot per token");
  auto slots = slot_mapping.to(at::kLong).contiguous();
  const auto as_cache = [&](const at::Tensor& x) {
    auto converted = x.to(k_cache.scalar_type());
    return converted.stride(2) == 1 ? converted : converted.contiguous();
  };
  auto keys = as_cache(k), values = as_cache(v);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < slots.numel(); ++t)
    TORCH_CHECK(slot_ptr[t] < num_slots, "slot ", slot_ptr[t], " is outside the cache's ", num_slots, " slots");
  copy_rows(keys, k_cache, slot_ptr);
  copy_rows(values, v_cache, slot_ptr);
}
