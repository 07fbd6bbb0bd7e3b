// Paged decode attention for the CPU: reads K/V straight from their blocks, with no gathered copy.
// A task computes every query head of a sequence's KV heads (all of them, or one when sequences are few and short)
// over its keys, or over one part of them when sequences are few and long (split_decode.h).
// Queries and outputs are fp32; the cache may be fp32, bf16, fp16 or fp8, widened as it is read. bf16 queries over
// a bf16 or fp8 cache take paged_decode_bf16.cpp instead where the CPU has AVX512-BF16. With AVX2 a key row is
// widened once for a run of query heads, eight tokens' scores are reduced together, and the weighted sum of values
// keeps a run's sums in registers (FMA directly); elsewhere the loops are written so that GCC vectorises them:
// fixed 8-wide partial sums instead of reductions, and a polynomial exp with no library call.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paged_attention_entry.h"
#include "paged_attention_bf16.h"
#include "simd_load.h"
#include "split_decode.h"
#include "vector_math.h"

namespace {

constexpr int64_t kLanes = 8;
// A query head's partial sums awaiting their reduction (head_scores_avx2): eight tokens' vectors of eight lanes.
constexpr int64_t kHeadPartials = 8 * kLanes;

template <typename T>
inline float dot(const float* q, const T* k, int64_t dim) {
  float partial[kLanes] = {};
  for (int64_t d = 0; d < dim; d += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += q[d + j] * static_cast<float>(k[d + j]);
  float acc = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) acc += partial[j];
  return acc;
}

#ifdef VIGIL_AVX2
// Lane i of the result is the horizontal sum of the i-th of eight vectors (`sums`, one after another), each added
// in horizontal_sum's order, so that a score's bits do not depend on where among the eight its token fell.
inline __m256 eight_horizontal_sums(const float* sums) {
  __m256 halves[4];  // lanes 0-3: vector 2i's lane j plus its lane j + 4; lanes 4-7: vector 2i + 1's
  for (int i = 0; i < 4; ++i) {
    const __m256 a = _mm256_loadu_ps(sums + 16 * i), b = _mm256_loadu_ps(sums + 16 * i + 8);
    halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  __m256 pairs[2];  // each 128-bit lane: one vector's (lane 0 + lane 2) and (lane 1 + lane 3), then another's
  for (int i = 0; i < 2; ++i) {
    const __m256d a = _mm256_castps_pd(halves[2 * i]), b = _mm256_castps_pd(halves[2 * i + 1]);
    pairs[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  const __m256 sums_in_pairs = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                             _mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Vectors 0, 2, 4, 6 then 1, 3, 5, 7.
  return _mm256_permutevar8x32_ps(sums_in_pairs, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// scores[h * span + t] for `Heads` query heads of one KV head, token t: the key row widened once for all of them,
// and every eighth token (and the last) the eight tokens' sums reduced together. `partial` holds Heads x
// kHeadPartials floats.
template <int Heads, typename T>
inline void head_scores_avx2(const float* queries, const T* key, int64_t t, int64_t span, int64_t dim,
                             float* partial, float* scores) {
  __m256 even[Heads], odd[Heads];
  for (int h = 0; h < Heads; ++h) even[h] = odd[h] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 16) {
    const __m256 first = vigil::load8(key + d), second = vigil::load8(key + d + 8);
    for (int h = 0; h < Heads; ++h) {
      even[h] = _mm256_fmadd_ps(_mm256_loadu_ps(queries + h * dim + d), first, even[h]);
      odd[h] = _mm256_fmadd_ps(_mm256_loadu_ps(queries + h * dim + d + 8), second, odd[h]);
    }
  }
  const int64_t slot = t % 8;
  for (int h = 0; h < Heads; ++h) _mm256_storeu_ps(partial + (h * 8 + slot) * 8, _mm256_add_ps(even[h], odd[h]));
  if (slot < 7 && t + 1 < span) return;
  for (int h = 0; h < Heads; ++h) {
    alignas(32) float sums[8];
    _mm256_store_ps(sums, eight_horizontal_sums(partial + h * kHeadPartials));
    std::copy(sums, sums + slot + 1, scores + h * span + t - slot);
  }
}

// The score pass over one token row (every KV head of the task): query heads of each KV head in runs of at most
// four, so that a run's sums stay in registers.
template <typename T>
inline void row_scores_avx2(const float* queries, const T* row, int64_t t, int64_t span, int64_t dim,
                            int64_t head_stride, int64_t task_heads, int64_t group, float* partial, float* scores) {
  for (int64_t first = 0; first < task_heads;) {
    const int64_t count = std::min<int64_t>(4, group - first % group);
    const T* key = row + (first / group) * head_stride;
    const float* q = queries + first * dim;
    float* part = partial + first * kHeadPartials;
    float* out = scores + first * span;
    if (count == 4)
      head_scores_avx2<4>(q, key, t, span, dim, part, out);
    else if (count == 3)
      head_scores_avx2<3>(q, key, t, span, dim, part, out);
    else if (count == 2)
      head_scores_avx2<2>(q, key, t, span, dim, part, out);
    else
      head_scores_avx2<1>(q, key, t, span, dim, part, out);
    first += count;
  }
}
#endif

template <typename T>
inline void axpy(float* out, float weight, const T* v, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) out[d] += weight * static_cast<float>(v[d]);
}

#ifdef VIGIL_AVX2
// acc[h][c:c+32] += sum over tokens of weights[h][t] * V[t][c:c+32] for `Heads` query heads of one KV head:
// 32 columns of each head stay in registers for the whole sweep over the tokens. Each row is fetched a block
// ahead: the columns read, or in the first sweep `ahead_bytes` of it where that is not 0.
template <int Heads, typename T>
inline void weighted_values_avx2(const T* values, const int32_t* table, int64_t first, int64_t len,
                                int64_t block_size, int64_t block_stride, int64_t token_stride, const float* weights,
                                float* acc, int64_t dim, int64_t ahead_bytes) {
  const int64_t num_blocks = (len + block_size - 1) / block_size;
  const int64_t span = len - first;
  for (int64_t c = 0; c < dim; c += 32) {
    __m256 sums[Heads][4];
    for (int h = 0; h < Heads; ++h)
      for (int k = 0; k < 4; ++k) sums[h][k] = _mm256_setzero_ps();
    for (int64_t b = first / block_size; b < num_blocks; ++b) {
      const T* base = values + table[b] * block_stride + c;
      const T* next = b + 1 < num_blocks ? values + table[b + 1] * block_stride + c : nullptr;
      const int64_t rows = std::min(block_size, len - b * block_size);
      for (int64_t i = b == first / block_size ? first % block_size : 0; i < rows; ++i) {
        if (next != nullptr && c == 0 && ahead_bytes > 0) {
          const char* row = reinterpret_cast<const char*>(next + i * token_stride);
          for (int64_t line = 0; line < ahead_bytes; line += 64) __builtin_prefetch(row + line);
        } else if (next != nullptr) {
          __builtin_prefetch(next + i * token_stride);
          __builtin_prefetch(next + i * token_stride + 16);
        }
        const T* v = base + i * token_stride;
        const int64_t t = b * block_size + i - first;
        // The heads' weights first, then a vector of values at a time: three heads' 12 sums, their weights and
        // one vector of values fill the 16 registers, where four vectors of values at once spilled a sum.
        __m256 w[Heads];
        for (int h = 0; h < Heads; ++h) w[h] = _mm256_set1_ps(weights[h * span + t]);
        for (int k = 0; k < 4; ++k) {
          const __m256 values_k = vigil::load8(v + 8 * k);
          for (int h = 0; h < Heads; ++h) sums[h][k] = _mm256_fmadd_ps(w[h], values_k, sums[h][k]);
        }
      }
    }
    for (int h = 0; h < Heads; ++h)
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(acc + h * dim + c + 8 * k, sums[h][k]);
  }
}

// The V pass of a task: query heads of each KV head in runs of at most three. A task over several KV heads passes
// `row_bytes`, its rows' bytes: the first run fetches whole rows ahead, and the later runs find theirs in cache, as
// the bf16 kernel's value pass does (bf16_attention.h).
template <typename T>
inline void weighted_values_avx2(const T* values, const int32_t* table, int64_t first_token, int64_t len,
                                int64_t block_size, int64_t block_stride, int64_t token_stride, int64_t head_stride,
                                int64_t task_heads, int64_t group, const float* scores, float* acc, int64_t dim,
                                int64_t row_bytes) {
  const int64_t span = len - first_token;
  for (int64_t first = 0; first < task_heads; first += std::min<int64_t>(3, group - first % group)) {
    const int64_t count = std::min<int64_t>(3, group - first % group);
    const T* head_values = values + (first / group) * head_stride;
    const float* weights = scores + first * span;
    float* out = acc + first * dim;
    const int64_t ahead = first == 0 && task_heads > group ? row_bytes : 0;
    if (count == 3)
      weighted_values_avx2<3>(head_values, table, first_token, len, block_size, block_stride, token_stride, weights,
                              out, dim, ahead);
    else if (count == 2)
      weighted_values_avx2<2>(head_values, table, first_token, len, block_size, block_stride, token_stride, weights,
                              out, dim, ahead);
    else
      weighted_values_avx2<1>(head_values, table, first_token, len, block_size, block_stride, token_stride, weights,
                              out, dim, ahead);
  }
}
#endif

// Visits a sequence's token rows first..len-1 (every KV head of a token, contiguous) block by block, passing
// each one's index from first. While it reads token i of a block it prefetches token i of the next block: blocks
// lie anywhere in the pool, so no hardware prefetcher follows them.
template <typename T, typename Visit>
inline void for_each_token(const T* cache, const int32_t* table, int64_t first, int64_t len, int64_t block_size,
                           int64_t block_stride, int64_t token_stride, int64_t row_bytes, Visit&& visit) {
  const int64_t num_blocks = (len + block_size - 1) / block_size;
  for (int64_t b = first / block_size; b < num_blocks; ++b) {
    const T* base = cache + table[b] * block_stride;
    const T* next = b + 1 < num_blocks ? cache + table[b + 1] * block_stride : nullptr;
    const int64_t rows = std::min(block_size, len - b * block_size);
    for (int64_t i = b == first / block_size ? first % block_size : 0; i < rows; ++i) {
      if (next != nullptr) {
        const char* ahead = reinterpret_cast<const char*>(next + i * token_stride);
        for (int64_t line = 0; line < row_bytes; line += 64) __builtin_prefetch(ahead + line);
      }
      visit(b * block_size + i - first, base + i * token_stride);
    }
  }
}

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, int64_t window,
            at::Tensor& out) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t table_width = block_tables.size(1);
  const int64_t token_stride = k_cache.stride(1), block_stride = k_cache.stride(0), head_stride = k_cache.stride(2);
  const float* q_ptr = q.data_ptr<float>();
  const T* k_ptr = k_cache.data_ptr<T>();
  const T* v_ptr = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  float* out_ptr = out.data_ptr<float>();
  // A task is a sequence's run of KV heads and one part of its keys (split_decode.h); parts past one keep each
  // part's sums and softmax statistics, merged once every part is done.
  const vigil::DecodeTasks cut =
      vigil::decode_tasks(num_seqs, num_kv_heads, vigil::longest_keys(lens, num_seqs, window));
  const int64_t heads_per_task = cut.kv_heads, parts = cut.parts;
  const int64_t tasks_per_seq = num_kv_heads / heads_per_task, task_heads = heads_per_task * group;
  const int64_t row_bytes = ((heads_per_task - 1) * head_stride + dim) * static_cast<int64_t>(sizeof(T));
  vigil::PartResults part_results(num_seqs * tasks_per_seq, parts, task_heads, dim);

  vigil::TaskQueue queue(num_seqs * tasks_per_seq * parts);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> queries(task_heads * dim), scores, acc(task_heads * dim), partial(task_heads * kHeadPartials);
    for (int64_t task = queue.take(); task < queue.count(); task = queue.take()) {
      const int64_t unit = task / parts, seq = unit / tasks_per_seq;
      const int64_t first_kv_head = (unit % tasks_per_seq) * heads_per_task;
      const vigil::KeyRange keys =
          vigil::part_of_keys(vigil::first_key(lens[seq], window), lens[seq], parts, task % parts, block_size);
      const int64_t first = keys.begin, len = keys.end, span = len - first;
      if (span == 0) {
        part_results.record_empty(task);
        continue;
      }
      const int32_t* table = tables + seq * table_width;
      const int64_t head_offset = first_kv_head * head_stride;
      for (int64_t h = 0; h < task_heads; ++h) {
        const float* src = q_ptr + q.stride(0) * seq + q.stride(1) * (first_kv_head * group + h);
        for (int64_t d = 0; d < dim; ++d) queries[h * dim + d] = src[d] * static_cast<float>(scale);
      }
      const auto write_out = [&](const float* sums) {
        for (int64_t h = 0; h < task_heads; ++h) {
          float* to = parts > 1 ? part_results.output(task, h)
                                : out_ptr + out.stride(0) * seq + out.stride(1) * (first_kv_head * group + h);
          std::copy(sums + h * dim, sums + (h + 1) * dim, to);
        }
      };
      scores.resize(task_heads * span);
      for_each_token(k_ptr + head_offset, table, first, len, block_size, block_stride, token_stride, row_bytes,
                     [&](int64_t t, const T* row) {
#ifdef VIGIL_AVX2
                       if (dim % 16 == 0) {
                         row_scores_avx2(queries.data(), row, t, span, dim, head_stride, task_heads, group,
                                         partial.data(), scores.data());
                         return;
                       }
#endif
                       for (int64_t h = 0; h < task_heads; ++h)
                         scores[h * span + t] = dot(&queries[h * dim], row + (h / group) * head_stride, dim);
                     });
      for (int64_t h = 0; h < task_heads; ++h) part_results.record(task, h, vigil::softmax(&scores[h * span], span));
      std::fill(acc.begin(), acc.end(), 0.f);
#ifdef VIGIL_AVX2
      if (dim % 32 == 0) {
        weighted_values_avx2(v_ptr + head_offset, table, first, len, block_size, block_stride, token_stride,
                             head_stride, task_heads, group, scores.data(), acc.data(), dim, row_bytes);
        write_out(acc.data());
        continue;
      }
#endif
      for_each_token(v_ptr + head_offset, table, first, len, block_size, block_stride, token_stride, row_bytes,
                     [&](int64_t t, const T* row) {
                       for (int64_t h = 0; h < task_heads; ++h)
                         axpy(&acc[h * dim], scores[h * span + t], row + (h / group) * head_stride, dim);
                     });
      write_out(acc.data());
    }
  });
  if (parts == 1) return;
  part_results.merge(num_seqs * tasks_per_seq, [&](int64_t unit, int64_t h) {
    return out_ptr + unit / tasks_per_seq * out.stride(0) + ((unit % tasks_per_seq) * task_heads + h) * out.stride(1);
  });
}

}  // namespace

// window > 0: each query sees only the last `window` keys of its context (sliding-window attention).
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                     at::Tensor block_tables, at::Tensor seq_lens, double scale, int64_t window) {
  vigil::check_paged_attention_inputs(q, k_cache, v_cache);
  TORCH_CHECK(q.size(2) % kLanes == 0, "head_dim must be a multiple of 8");
  auto tables = block_tables.to(at::kInt).contiguous();
  auto lens = seq_lens.to(at::kInt).contiguous();
#ifdef VIGIL_AVX512_BF16
  if (vigil::bf16_attention_applies(q, k_cache))
    return vigil::paged_decode_bf16(q, k_cache, v_cache, tables, lens, scale, window);
#endif
  const auto kernel = [&](auto cache_type, const at::Tensor& queries, at::Tensor& out) {
    decode<decltype(cache_type)>(queries, k_cache, v_cache, tables, lens, scale, window, out);
  };
  return vigil::attend_in_fp32(q, k_cache.scalar_type(), kernel);
}
