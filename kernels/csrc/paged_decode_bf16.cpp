// Paged decode attention with bf16 queries over a bf16 or fp8 cache, on CPUs with AVX512-BF16 (bf16_attention.h).
// A task is a sequence and a run of its KV heads, with every query head that reads them.
#include "paged_attention_bf16.h"

#ifdef VIGIL_AVX512_BF16

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "bf16_attention.h"
#include "vector_math.h"

namespace vigil {

using namespace bf16_attention;

namespace {

template <typename Cache>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
            const at::Tensor& lens, double scale, int64_t window, at::Tensor& out) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(2), group = num_heads / num_kv_heads, vectors = dim / 32;
  const int64_t kv_heads_per_task = decode_kv_heads_per_task(num_seqs, num_kv_heads);
  const int64_t tasks_per_seq = num_kv_heads / kv_heads_per_task;
  const int64_t row_bytes = ((kv_heads_per_task - 1) * k_cache.stride(2) + dim) * static_cast<int64_t>(sizeof(Cache));
  const bf16* q_ptr = q.data_ptr<bf16>();
  const Cache* k_ptr = k_cache.data_ptr<Cache>();
  const Cache* v_ptr = v_cache.data_ptr<Cache>();
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  bf16* out_ptr = out.data_ptr<bf16>();

  TaskQueue queue(num_seqs * tasks_per_seq);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<int64_t> rows;
    ScoreScratch scratch;
    std::vector<const bf16*> query_rows(kv_heads_per_task * group);
    std::vector<const Cache*> key_rows(kv_heads_per_task * group);
    std::vector<bf16*> out_rows(group);
    const auto first_token = [&](int64_t seq) {  // the first context token the sequence's query sees
      return window > 0 ? std::max<int64_t>(0, len_ptr[seq] - window) : 0;
    };
    for (int64_t task = queue.take(), following; task < queue.count(); task = following) {
      following = queue.take();  // taken now, so that its first key block is fetched ahead
      const int64_t seq = task / tasks_per_seq, len = len_ptr[seq];
      const int64_t first = first_token(seq), span = len - first;
      token_rows(table_ptr + seq * tables.size(1), first, len, k_cache.size(1), k_cache.stride(0), k_cache.stride(1),
                 rows);
      const int64_t first_kv = (task % tasks_per_seq) * kv_heads_per_task, heads = kv_heads_per_task * group;
      scores.resize(heads * span);
      for (int64_t h = 0; h < heads; ++h) {
        query_rows[h] = q_ptr + seq * q.stride(0) + (first_kv * group + h) * q.stride(1);
        key_rows[h] = k_ptr + (first_kv + h / group) * k_cache.stride(2);
      }
      score_rows(query_rows.data(), key_rows.data(), heads, rows.data(), span, vectors, static_cast<float>(scale),
                 k_ptr + first_kv * k_cache.stride(2), row_bytes, scratch, scores.data());
      // The passes prefetch one chunk ahead of the one they read, so each would start on a chunk still in memory:
      // the values' first chunk is fetched during the softmax, and the next task's first key block during the value
      // pass.
      const int first_chunk = static_cast<int>(std::min<int64_t>(kChunk, span));
      prefetch_rows(v_ptr + first_kv * k_cache.stride(2), rows.data(), first_chunk, row_bytes);
      for (int64_t h = 0; h < heads; ++h) vigil::softmax(&scores[h * span], span);
      if (following < queue.count()) {
        const int64_t next = following / tasks_per_seq;
        prefetch_block(k_ptr, table_ptr + next * tables.size(1), first_token(next), k_cache.size(1), k_cache.stride(0));
      }
      for (int64_t g = first_kv; g < first_kv + kv_heads_per_task; ++g) {
        for (int64_t h = 0; h < group; ++h)
          out_rows[h] = out_ptr + seq * out.stride(0) + (g * group + h) * out.stride(1);
        weighted_values(v_ptr + g * k_cache.stride(2), rows.data(), span, &scores[(g - first_kv) * group * span], group,
                        dim, out_rows.data());
      }
    }
  });
}

}  // namespace

at::Tensor paged_decode_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& tables, const at::Tensor& lens, double scale, int64_t window) {
  auto out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  with_bf16_kernel_cache(k_cache.scalar_type(), [&](auto cache_type) {
    decode<decltype(cache_type)>(q, k_cache, v_cache, tables, lens, scale, window, out);
  });
  return out;
}

}  // namespace vigil

#endif
