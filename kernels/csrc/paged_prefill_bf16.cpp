// Paged prefill attention with bf16 queries over a bf16 or fp8 cache, on CPUs with AVX512-BF16 (bf16_attention.h). A
// task is a tile of up to 32 new tokens of one sequence and one KV head, with every query head that shares it; its rows
// are (token, query head) pairs. Each row is scored against every key up to the tile's last token, the softmax keeps
// only the keys it may see (its own position and before, within the window), and the values are summed four rows at a
// time. Where AMX tiles are usable, paged_prefill_amx.cpp takes steps with enough new tokens (kernels/backend.py).
#include "paged_attention_bf16.h"

#ifdef VIGIL_AVX512_BF16

#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "bf16_attention.h"
#include "vector_math.h"

namespace vigil {

using namespace bf16_attention;

namespace {

template <typename Cache>
void prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
             const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& seq_lens, double scale,
             int64_t window, at::Tensor& out) {
  const int64_t num_heads = q.size(1), dim = q.size(2), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, vectors = dim / 32, head_stride = k_cache.stride(2);
  const bf16* q_ptr = q.data_ptr<bf16>();
  const Cache* k_ptr = k_cache.data_ptr<Cache>();
  const Cache* v_ptr = v_cache.data_ptr<Cache>();
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  bf16* out_ptr = out.data_ptr<bf16>();

  const std::vector<PrefillTask> tasks = prefill_tasks(cu_seqlens, num_kv_heads);

  TaskQueue queue(static_cast<int64_t>(tasks.size()));
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<int64_t> rows;
    ScoreScratch scratch;
    std::vector<bf16> widened_values;
    std::vector<const bf16*> query_rows;
    std::vector<const Cache*> key_rows;
    std::vector<bf16*> out_rows;
    for (int64_t index = queue.take(); index < queue.count(); index = queue.take()) {
      const PrefillTask& task = tasks[index];
      const int64_t num_new = cu_seqlens[task.seq + 1] - cu_seqlens[task.seq];
      const int64_t tokens = std::min(kPrefillTileTokens, num_new - task.first_token), count = tokens * group;
      const int64_t first_position = seq_lens[task.seq] - num_new + task.first_token;
      // Keys first..last-1: up to the tile's last token, from the first that its first token's window holds.
      const int64_t last = first_position + tokens;
      const int64_t first = window > 0 ? std::max<int64_t>(0, first_position - window + 1) : 0, span = last - first;
      token_rows(table_ptr + task.seq * tables.size(1), first, last, k_cache.size(1), k_cache.stride(0),
                 k_cache.stride(1), rows);
      const Cache* keys = k_ptr + task.kv_head * head_stride;
      query_rows.resize(count);
      out_rows.resize(count);
      key_rows.assign(count, keys);
      // Row r is new token first_token + r / group and query head kv_head * group + r % group.
      for (int64_t r = 0; r < count; ++r) {
        const int64_t token = cu_seqlens[task.seq] + task.first_token + r / group;
        const int64_t head = task.kv_head * group + r % group;
        query_rows[r] = q_ptr + token * q.stride(0) + head * q.stride(1);
        out_rows[r] = out_ptr + token * out.stride(0) + head * out.stride(1);
      }
      scores.resize(count * span);
      score_rows(query_rows.data(), key_rows.data(), count, rows.data(), span, vectors, static_cast<float>(scale),
                 keys, dim * static_cast<int64_t>(sizeof(Cache)), scratch, scores.data());
      for (int64_t r = 0; r < count; ++r) {
        float* row = scores.data() + r * span;
        const int64_t seen = first_position + r / group + 1 - first;  // keys up to the row's own position
        const int64_t from = window > 0 ? std::max<int64_t>(0, seen - window) : 0;
        std::fill(row, row + from, 0.f);
        vigil::softmax(row + from, seen - from);
        std::fill(row + seen, row + span, 0.f);
      }
      const Cache* values = v_ptr + task.kv_head * head_stride;
      if constexpr (std::is_same_v<Cache, bf16>) {
        weighted_values(values, rows.data(), span, scores.data(), count, dim, out_rows.data());
      } else {  // the rows read each value row count / 4 times
        widen_values(values, rows.data(), span, dim, widened_values);
        for (int64_t t = 0; t < span; ++t) rows[t] = t * dim;
        weighted_values(widened_values.data(), rows.data(), span, scores.data(), count, dim, out_rows.data());
      }
    }
  });
}

}  // namespace

at::Tensor paged_prefill_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& tables, const std::vector<int64_t>& cu_seqlens,
                              const std::vector<int64_t>& seq_lens, double scale, int64_t window) {
  auto out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  with_bf16_kernel_cache(k_cache.scalar_type(), [&](auto cache_type) {
    prefill<decltype(cache_type)>(q, k_cache, v_cache, tables, cu_seqlens, seq_lens, scale, window, out);
  });
  return out;
}

}  // namespace vigil

#endif
