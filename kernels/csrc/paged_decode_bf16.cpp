// Paged decode attention with bf16 queries over a bf16 or fp8 cache, on CPUs with AVX512-BF16 (bf16_attention.h).
// A task is a sequence and a run of its KV heads, with every query head that reads them, over the sequence's keys or
// one part of them (split_decode.h).
#include "paged_attention_bf16.h"

#ifdef VIGIL_AVX512_BF16

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "bf16_attention.h"
#include "split_decode.h"
#include "vector_math.h"

namespace vigil {

using namespace bf16_attention;

namespace {

template <typename Cache>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
            const at::Tensor& lens, double scale, int64_t window, at::Tensor& out) {
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(2), group = num_heads / num_kv_heads, vectors = dim / 32;
  const bf16* q_ptr = q.data_ptr<bf16>();
  const Cache* k_ptr = k_cache.data_ptr<Cache>();
  const Cache* v_ptr = v_cache.data_ptr<Cache>();
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  bf16* out_ptr = out.data_ptr<bf16>();
  // A task is a sequence's run of KV heads and one part of its keys (split_decode.h); parts past one write fp32
  // outputs and softmax statistics a part, merged once every part is done.
  const DecodeTasks cut = decode_tasks(num_seqs, num_kv_heads, longest_keys(len_ptr, num_seqs, window));
  const int64_t kv_heads_per_task = cut.kv_heads, parts = cut.parts;
  const int64_t tasks_per_seq = num_kv_heads / kv_heads_per_task, heads = kv_heads_per_task * group;
  const int64_t row_bytes = ((kv_heads_per_task - 1) * k_cache.stride(2) + dim) * static_cast<int64_t>(sizeof(Cache));
  PartResults part_results(num_seqs * tasks_per_seq, parts, heads, dim);
  const auto keys_of = [&](int64_t task) {
    const int64_t len = len_ptr[task / parts / tasks_per_seq];
    return part_of_keys(first_key(len, window), len, parts, task % parts, kChunk);
  };

  TaskQueue queue(num_seqs * tasks_per_seq * parts);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<int64_t> rows;
    ScoreScratch scratch;
    std::vector<const bf16*> query_rows(heads);
    std::vector<const Cache*> key_rows(heads);
    std::vector<bf16*> out_rows(group);
    std::vector<float*> part_rows(group);
    for (int64_t task = queue.take(), following; task < queue.count(); task = following) {
      following = queue.take();  // taken now, so that its first key block is fetched ahead
      const int64_t unit = task / parts, seq = unit / tasks_per_seq;
      const KeyRange keys = keys_of(task);
      const int64_t span = keys.end - keys.begin;
      if (span == 0) {
        part_results.record_empty(task);
        continue;
      }
      token_rows(table_ptr + seq * tables.size(1), keys.begin, keys.end, k_cache.size(1), k_cache.stride(0),
                 k_cache.stride(1), rows);
      const int64_t first_kv = (unit % tasks_per_seq) * kv_heads_per_task;
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
      for (int64_t h = 0; h < heads; ++h) part_results.record(task, h, vigil::softmax(&scores[h * span], span));
      const KeyRange next_keys = following < queue.count() ? keys_of(following) : KeyRange{0, 0};
      if (next_keys.begin < next_keys.end)
        prefetch_block(k_ptr, table_ptr + following / parts / tasks_per_seq * tables.size(1), next_keys.begin,
                       k_cache.size(1), k_cache.stride(0));
      for (int64_t g = first_kv; g < first_kv + kv_heads_per_task; ++g) {
        const float* weights = &scores[(g - first_kv) * group * span];
        const int64_t ahead_bytes = g == first_kv && kv_heads_per_task > 1 ? row_bytes : 0;
        if (parts == 1) {
          for (int64_t h = 0; h < group; ++h)
            out_rows[h] = out_ptr + seq * out.stride(0) + (g * group + h) * out.stride(1);
          weighted_values(v_ptr + g * k_cache.stride(2), rows.data(), span, weights, group, dim, out_rows.data(),
                          ahead_bytes);
          continue;
        }
        for (int64_t h = 0; h < group; ++h)
          part_rows[h] = part_results.output(task, (g - first_kv) * group + h);
        weighted_values(v_ptr + g * k_cache.stride(2), rows.data(), span, weights, group, dim, part_rows.data(),
                        ahead_bytes);
      }
    }
  });
  if (parts == 1) return;
  part_results.merge(num_seqs * tasks_per_seq, [&](int64_t unit, int64_t h) {
    return out_ptr + unit / tasks_per_seq * out.stride(0) + ((unit % tasks_per_seq) * heads + h) * out.stride(1);
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
