// Paged prefill attention for the CPU: causal attention of each sequence's new tokens over its whole paged
// context, with K/V read in place from their blocks.
//
// A task is a tile of up to 32 new tokens of one sequence and one KV head, together with every query head that
// shares that KV head; its rows are (token, query head) pairs. Keys are visited in chunks of 16 tokens. Each chunk
// is widened to fp32 once from the cache's dtype, K transposed, and every row of the tile uses it: scores are a
// [rows x dim] . [dim x 16] product and the weighted values a [rows x 16] . [16 x dim] one, both register-blocked
// (with AVX2 six rows by 16 keys, eight loads for 12 FMAs, and two rows by 32 columns). Every row's sums are the
// same chain of FMAs wherever it falls in a tile. Softmax runs on whole rows between the two passes. bf16 queries
// over a bf16 or fp8 cache take paged_prefill_bf16.cpp instead where the CPU has AVX512-BF16.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paged_attention_bf16.h"
#include "paged_attention_entry.h"
#include "paged_prefill_amx.h"
#include "simd_load.h"
#include "transpose8.h"
#include "vector_math.h"

namespace {

constexpr int64_t kChunk = 16;

// out[r * out_stride + j] = q[r] . keys[:, j] for rows r and the kChunk keys j; keys is [dim, kChunk].
void chunk_scores(const float* q, int64_t rows, const float* keys, int64_t dim, float* out, int64_t out_stride) {
  int64_t r = 0;
#ifdef VIGIL_AVX2
  // Six rows by 16 keys: 12 sums, two vectors of keys and a broadcast row value fill 15 of the 16 registers.
  for (; r + 6 <= rows; r += 6) {
    __m256 first[6], second[6];
    for (int i = 0; i < 6; ++i) first[i] = second[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; ++d) {
      const __m256 k0 = _mm256_loadu_ps(keys + d * kChunk), k1 = _mm256_loadu_ps(keys + d * kChunk + 8);
      for (int i = 0; i < 6; ++i) {
        const __m256 x = _mm256_broadcast_ss(q + (r + i) * dim + d);
        first[i] = _mm256_fmadd_ps(x, k0, first[i]);
        second[i] = _mm256_fmadd_ps(x, k1, second[i]);
      }
    }
    for (int i = 0; i < 6; ++i) {
      _mm256_storeu_ps(out + (r + i) * out_stride, first[i]);
      _mm256_storeu_ps(out + (r + i) * out_stride + 8, second[i]);
    }
  }
  for (; r < rows; ++r) {
    __m256 first = _mm256_setzero_ps(), second = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; ++d) {
      const __m256 x = _mm256_broadcast_ss(q + r * dim + d);
      first = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys + d * kChunk), first);
      second = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys + d * kChunk + 8), second);
    }
    _mm256_storeu_ps(out + r * out_stride, first);
    _mm256_storeu_ps(out + r * out_stride + 8, second);
  }
#endif
  for (; r < rows; ++r) {
    float sums[kChunk] = {};
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = 0; j < kChunk; ++j) sums[j] += q[r * dim + d] * keys[d * kChunk + j];
    std::copy(sums, sums + kChunk, out + r * out_stride);
  }
}

// acc[r] += sum over j of weights[r * weight_stride + j] * values[j] for the kChunk value rows of [kChunk, dim].
void chunk_values(const float* weights, int64_t weight_stride, int64_t rows, const float* values, int64_t dim,
                  float* acc) {
  int64_t r = 0;
#ifdef VIGIL_AVX2
  if (dim % 32 == 0) {
    // Two rows by 32 columns in registers, each value vector loaded once for both rows.
    for (; r + 2 <= rows; r += 2)
      for (int64_t c = 0; c < dim; c += 32) {
        float* top = acc + r * dim + c;
        float* bottom = top + dim;
        __m256 a[4], b[4];
        for (int k = 0; k < 4; ++k) {
          a[k] = _mm256_loadu_ps(top + 8 * k);
          b[k] = _mm256_loadu_ps(bottom + 8 * k);
        }
        for (int64_t j = 0; j < kChunk; ++j) {
          const __m256 wa = _mm256_broadcast_ss(weights + r * weight_stride + j);
          const __m256 wb = _mm256_broadcast_ss(weights + (r + 1) * weight_stride + j);
          for (int k = 0; k < 4; ++k) {
            const __m256 v = _mm256_loadu_ps(values + j * dim + c + 8 * k);
            a[k] = _mm256_fmadd_ps(wa, v, a[k]);
            b[k] = _mm256_fmadd_ps(wb, v, b[k]);
          }
        }
        for (int k = 0; k < 4; ++k) {
          _mm256_storeu_ps(top + 8 * k, a[k]);
          _mm256_storeu_ps(bottom + 8 * k, b[k]);
        }
      }
  }
#endif
  for (; r < rows; ++r)
    for (int64_t j = 0; j < kChunk; ++j) {
      const float w = weights[r * weight_stride + j];
      for (int64_t d = 0; d < dim; ++d) acc[r * dim + d] += w * values[j * dim + d];
    }
}

// dst[0:n] = src[0:n] in fp32.
template <typename T>
void widen(const T* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef VIGIL_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, vigil::load8(src + i));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// keys [dim, kChunk]: the chunk's `count` key rows (row_of(j) the j-th), widened into key_rows [kChunk, dim] and
// transposed; zero past count.
template <typename RowOf>
void transposed_keys(const RowOf& row_of, int64_t count, int64_t dim, float* key_rows, float* keys) {
  for (int64_t j = 0; j < count; ++j) widen(row_of(j), key_rows + j * dim, dim);
  std::fill(key_rows + count * dim, key_rows + kChunk * dim, 0.f);
#ifdef VIGIL_AVX2
  if (dim % 8 == 0) {
    for (int64_t j = 0; j < kChunk; j += 8)
      for (int64_t d = 0; d < dim; d += 8)
        vigil::transpose8(key_rows + j * dim + d, dim, keys + d * kChunk + j, kChunk);
    return;
  }
#endif
  for (int64_t j = 0; j < kChunk; ++j)
    for (int64_t d = 0; d < dim; ++d) keys[d * kChunk + j] = key_rows[j * dim + d];
}

template <typename T>
void prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
             const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& seq_lens, double scale,
             int64_t window, at::Tensor& out) {
  const int64_t num_heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, table_width = tables.size(1);
  const int64_t block_stride = k_cache.stride(0), token_stride = k_cache.stride(1), head_stride = k_cache.stride(2);
  const float* q_ptr = q.data_ptr<float>();
  const T* k_ptr = k_cache.data_ptr<T>();
  const T* v_ptr = v_cache.data_ptr<T>();
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  float* out_ptr = out.data_ptr<float>();

  const std::vector<vigil::PrefillTask> tasks = vigil::prefill_tasks(cu_seqlens, num_kv_heads);

  vigil::TaskQueue queue(static_cast<int64_t>(tasks.size()));
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> queries, scores, acc, key_rows(kChunk * dim), keys(dim * kChunk), values(kChunk * dim);
    for (int64_t index = queue.take(); index < queue.count(); index = queue.take()) {
      const vigil::PrefillTask& task = tasks[index];
      const int64_t num_new = cu_seqlens[task.seq + 1] - cu_seqlens[task.seq];
      const int64_t tokens = std::min(vigil::kPrefillTileTokens, num_new - task.first_token);
      const int64_t rows = tokens * group;
      // Row r is new token first_token + r / group, at this position, and query head kv_head * group + r % group.
      const int64_t first_position = seq_lens[task.seq] - num_new + task.first_token;
      const int64_t span = first_position + tokens;  // keys up to the tile's last token
      // With a window, the chunks before the first key that the tile's first token sees are skipped.
      const int64_t first_chunk = window > 0 ? std::max<int64_t>(0, first_position - window + 1) / kChunk : 0;
      const int64_t chunks = (span + kChunk - 1) / kChunk, width = (chunks - first_chunk) * kChunk;
      const int64_t base = first_chunk * kChunk;
      const int32_t* table = table_ptr + task.seq * table_width;
      const auto row_of = [&](const T* cache, int64_t token) {
        return cache + table[token / block_size] * block_stride + (token % block_size) * token_stride +
               task.kv_head * head_stride;
      };
      // The offset of row r in a [tokens, heads, dim] tensor with these strides.
      const auto offset_of = [&](int64_t r, int64_t token_step, int64_t head_step) {
        return (cu_seqlens[task.seq] + task.first_token + r / group) * token_step +
               (task.kv_head * group + r % group) * head_step;
      };

      queries.resize(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        const float* src = q_ptr + offset_of(r, q.stride(0), q.stride(1));
        for (int64_t d = 0; d < dim; ++d) queries[r * dim + d] = src[d] * static_cast<float>(scale);
      }
      scores.resize(rows * width);
      for (int64_t c = first_chunk; c < chunks; ++c) {
        const int64_t count = std::min(kChunk, span - c * kChunk);
        transposed_keys([&](int64_t j) { return row_of(k_ptr, c * kChunk + j); }, count, dim, key_rows.data(),
                        keys.data());
        chunk_scores(queries.data(), rows, keys.data(), dim, scores.data() + c * kChunk - base, width);
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores.data() + r * width;
        // The row's keys, counted from base: up to its own position, and from `window` before it.
        const int64_t end = first_position + r / group + 1 - base;
        const int64_t begin = window > 0 ? std::max<int64_t>(0, end - window) : 0;
        std::fill(row, row + begin, 0.f);
        vigil::softmax(row + begin, end - begin);
        std::fill(row + end, row + width, 0.f);
      }
      acc.assign(rows * dim, 0.f);
      for (int64_t c = first_chunk; c < chunks; ++c) {
        const int64_t count = std::min(kChunk, span - c * kChunk);
        std::fill(values.begin() + count * dim, values.end(), 0.f);
        for (int64_t j = 0; j < count; ++j) widen(row_of(v_ptr, c * kChunk + j), values.data() + j * dim, dim);
        chunk_values(scores.data() + c * kChunk - base, width, rows, values.data(), dim, acc.data());
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float* sums = acc.data() + r * dim;
        std::copy(sums, sums + dim, out_ptr + offset_of(r, out.stride(0), out.stride(1)));
      }
    }
  });
}

}  // namespace

// window > 0: each query sees only the `window` keys up to its own position (sliding-window attention).
at::Tensor paged_prefill_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                                   at::Tensor cu_seqlens_q, at::Tensor seq_lens, double scale, int64_t window,
                                   bool tiles) {
  vigil::check_paged_attention_inputs(q, k_cache, v_cache);
  TORCH_CHECK(k_cache.size(1) % 8 == 0, "block size must be a multiple of 8");
  auto tables = block_tables.to(at::kInt).contiguous();
  auto cu = cu_seqlens_q.to(at::kLong).contiguous();
  auto lens = seq_lens.to(at::kLong).contiguous();
  const std::vector<int64_t> cu_seqlens(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  const std::vector<int64_t> context_lens(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + lens.numel());
  TORCH_CHECK(cu_seqlens.size() == context_lens.size() + 1 && tables.size(0) == lens.numel(),
              "one cu_seqlens boundary per sequence, plus one; one block table and one length per sequence");
  TORCH_CHECK(cu_seqlens.back() == q.size(0), "cu_seqlens must end at the number of query tokens");
  for (size_t i = 0; i < context_lens.size(); ++i) {
    const int64_t num_new = cu_seqlens[i + 1] - cu_seqlens[i];
    TORCH_CHECK(num_new >= 0 && num_new <= context_lens[i], "each sequence's new tokens are the end of its context");
    TORCH_CHECK(context_lens[i] <= tables.size(1) * k_cache.size(1), "a context is longer than its block table");
  }
#ifdef VIGIL_AMX
  if (tiles && vigil::bf16_attention_applies(q, k_cache) && vigil::amx::usable())
    return vigil::paged_prefill_amx(q, k_cache, v_cache, tables, cu_seqlens, context_lens, scale, window);
#endif
#ifdef VIGIL_AVX512_BF16
  if (vigil::bf16_attention_applies(q, k_cache))
    return vigil::paged_prefill_bf16(q, k_cache, v_cache, tables, cu_seqlens, context_lens, scale, window);
#endif
  const auto kernel = [&](auto cache_type, const at::Tensor& queries, at::Tensor& out) {
    prefill<decltype(cache_type)>(queries, k_cache, v_cache, tables, cu_seqlens, context_lens, scale, window, out);
  };
  return vigil::attend_in_fp32(q, k_cache.scalar_type(), kernel);
}
