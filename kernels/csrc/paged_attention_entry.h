// What the paged attention kernels share at their entry: the checks of q and the caches, and the call with
// fp32 queries on a cache of any dtype.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace vigil {

// q is [tokens, heads, head_dim]; the caches are [blocks, block_size, kv_heads, head_dim], alike in shape,
// layout and dtype.
inline void check_paged_attention_inputs(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4,
              "q is [tokens, heads, dim], caches are [blocks, size, kv_heads, dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "K and V caches must share a layout and a dtype");
  TORCH_CHECK(k_cache.stride(3) == 1 && q.stride(2) == 1, "head_dim must be contiguous");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
}

// A decode task is a sequence and a run of its KV heads. Whole sequences read each token row in one sweep, which
// streams best; with few sequences, single heads keep every thread busy.
inline int64_t decode_kv_heads_per_task(int64_t num_seqs, int64_t num_kv_heads) {
  return num_seqs >= 4 * at::get_num_threads() ? num_kv_heads : 1;
}

// Hands out task indices 0..count-1 to threads as they finish one, rather than in fixed shares: tasks differ in how
// many keys they read, and two cores here do not run at one rate. On the AMX Xeon: decode attention over sequences
// of 96-192 tokens 0.85x the time with the caches in L2 and 0.97-0.99x from memory; the paged prefill of one
// 512-token prompt 0.76x (bf16) and 0.69x (fp32). A kernel runs one loop of take() on every thread.
class TaskQueue {
 public:
  explicit TaskQueue(int64_t count) : count_(count) {}
  int64_t count() const { return count_; }
  // The next index nobody has taken, or count() when none is left.
  int64_t take() { return std::min(next_.fetch_add(1, std::memory_order_relaxed), count_); }

 private:
  const int64_t count_;
  std::atomic<int64_t> next_{0};
};

// A prefill task: up to kPrefillTileTokens new tokens of one sequence and one KV head, with every query head that
// shares it.
constexpr int64_t kPrefillTileTokens = 32;

struct PrefillTask {
  int64_t seq;
  int64_t kv_head;
  int64_t first_token;  // index among the sequence's new tokens
};

// A sequence's tiles come last one first: they see the most keys, so threads that take tasks as they finish (a
// TaskQueue) end together.
inline std::vector<PrefillTask> prefill_tasks(const std::vector<int64_t>& cu_seqlens, int64_t num_kv_heads) {
  std::vector<PrefillTask> tasks;
  for (int64_t seq = 0; seq + 1 < static_cast<int64_t>(cu_seqlens.size()); ++seq) {
    const int64_t num_new = cu_seqlens[seq + 1] - cu_seqlens[seq];
    for (int64_t first = (num_new - 1) / kPrefillTileTokens * kPrefillTileTokens; first >= 0;
         first -= kPrefillTileTokens)
      for (int64_t head = 0; head < num_kv_heads; ++head) tasks.push_back({seq, head, first});
  }
  return tasks;
}

// Calls kernel(cache_type, queries, out) with a value of the cache's C++ type (fp32, fp16, bf16 or fp8) and fp32
// queries and output, and returns the output in q's dtype. Queries and outputs are few, so they go through fp32
// whatever their dtype, and only the cache's dtype varies.
template <typename Kernel>
at::Tensor attend_in_fp32(const at::Tensor& q, at::ScalarType cache_type, Kernel&& kernel) {
  auto queries = q.to(at::kFloat);
  auto out = at::empty(q.sizes(), queries.options());
  switch (cache_type) {
    case at::kFloat:
      kernel(float{}, queries, out);
      break;
    case at::kHalf:
      kernel(at::Half{}, queries, out);
      break;
    case at::kBFloat16:
      kernel(at::BFloat16{}, queries, out);
      break;
    case at::kFloat8_e4m3fn:
      kernel(at::Float8_e4m3fn{}, queries, out);
      break;
    case at::kFloat8_e5m2:
      kernel(at::Float8_e5m2{}, queries, out);
      break;
    default:
      TORCH_CHECK(false, "a KV cache is float32, float16, bfloat16, float8_e4m3fn or float8_e5m2, not ", cache_type);
  }
  return out.to(q.scalar_type());
}

}  // namespace vigil
