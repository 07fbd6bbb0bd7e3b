// Paged decode attention for the CPU: reads K/V straight from their blocks, with no gathered copy.
// One task per (sequence, KV head); the task computes every query head of that KV head's group.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline float dot(const float* q, const T* k, int64_t dim) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < dim; ++d) acc += q[d] * static_cast<float>(k[d]);
  return acc;
}

template <typename T>
inline void axpy(float* out, float weight, const T* v, int64_t dim) {
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) out[d] += weight * static_cast<float>(v[d]);
}

template <typename T>
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t table_width = block_tables.size(1);
  const int64_t token_stride = k_cache.stride(1), block_stride = k_cache.stride(0), head_stride = k_cache.stride(2);
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k_cache.data_ptr<T>();
  const T* v_ptr = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  T* out_ptr = out.data_ptr<T>();

  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> queries(group * dim), scores, acc(group * dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t seq = task / num_kv_heads, kv_head = task % num_kv_heads;
      const int64_t len = lens[seq];
      const int32_t* table = tables + seq * table_width;
      for (int64_t g = 0; g < group; ++g) {
        const T* src = q_ptr + q.stride(0) * seq + q.stride(1) * (kv_head * group + g);
        for (int64_t d = 0; d < dim; ++d) queries[g * dim + d] = static_cast<float>(src[d]) * scale;
      }
      scores.assign(group * len, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const T* key = k_ptr + table[t / block_size] * block_stride + (t % block_size) * token_stride +
                       kv_head * head_stride;
        for (int64_t g = 0; g < group; ++g) scores[g * len + t] = dot(&queries[g * dim], key, dim);
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = &scores[g * len];
        const float peak = *std::max_element(row, row + len);
        float total = 0.f;
        for (int64_t t = 0; t < len; ++t) total += (row[t] = std::exp(row[t] - peak));
        const float inverse = 1.f / total;
        for (int64_t t = 0; t < len; ++t) row[t] *= inverse;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const T* value = v_ptr + table[t / block_size] * block_stride + (t % block_size) * token_stride +
                         kv_head * head_stride;
        for (int64_t g = 0; g < group; ++g) axpy(&acc[g * dim], scores[g * len + t], value, dim);
      }
      for (int64_t g = 0; g < group; ++g) {
        T* dst = out_ptr + out.stride(0) * seq + out.stride(1) * (kv_head * group + g);
        for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[g * dim + d]);
      }
    }
  });
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q is [seqs, heads, dim], caches are [blocks, size, kv_heads, dim]");
  TORCH_CHECK(k_cache.strides() == v_cache.strides(), "K and V caches must share a layout");
  TORCH_CHECK(k_cache.stride(3) == 1 && q.stride(2) == 1, "head_dim must be contiguous");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  auto tables = block_tables.to(torch::kInt32).contiguous();
  auto lens = seq_lens.to(torch::kInt32).contiguous();
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_decode_attention", [&] {
    decode<scalar_t>(q, k_cache, v_cache, tables, lens, scale, out);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "Paged decode attention (CPU)");
}
