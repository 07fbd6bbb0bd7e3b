// Decode attention over few sequences, split along the keys (flash-decoding). With few sequences a decode task
// was one sequence's single KV head: one sequence of SmolLM2 (three KV heads) made three tasks for two threads, so
// one thread read twice the keys the other did, and each task read a third of every token row. Where the keys are
// long enough, a task is instead one part of a sequence's keys with every KV head: whole token rows, and parts
// enough to keep every thread busy. Each part's output is normalised over its own keys; the parts are then mixed by
// their softmax statistics. On two Zen 5 cores, a single stream's decode step with the split took 0.92x the time
// at about 1,100 tokens of context and 0.90x at about 4,000 (int8; bf16 0.96x and 0.92x), and the same below 512.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "paged_attention_entry.h"
#include "vector_math.h"

namespace vigil {

// Below this many keys a part's fixed costs (its queries, its softmax statistics, its merge) outweigh the balance.
constexpr int64_t kMinPartTokens = 256;

// How a decode call's work is cut: each task reads `kv_heads` KV heads of one sequence over one of `parts` parts
// of its keys.
struct DecodeTasks {
  int64_t kv_heads;
  int64_t parts;
};

// Many sequences: a task a sequence, every KV head, so that each token row is read in one sweep. Few: a sequence's
// keys in parts, still every KV head a task, about eight tasks a thread and none shorter than kMinPartTokens. Few
// and short: a task a KV head (decode_kv_heads_per_task).
inline DecodeTasks decode_tasks(int64_t num_seqs, int64_t num_kv_heads, int64_t longest_span) {
  const int64_t threads = at::get_num_threads();
  if (num_seqs >= 4 * threads) return {num_kv_heads, 1};
  const int64_t parts = std::min((8 * threads + num_seqs - 1) / num_seqs, longest_span / kMinPartTokens);
  if (parts > 1) return {num_kv_heads, parts};
  return {decode_kv_heads_per_task(num_seqs, num_kv_heads), 1};
}

// The first key a decode query sees in a context of `len`: all of them, or the last `window`.
inline int64_t first_key(int64_t len, int64_t window) { return window > 0 ? std::max<int64_t>(0, len - window) : 0; }

// The most keys any of the sequences' queries sees.
inline int64_t longest_keys(const int32_t* lens, int64_t num_seqs, int64_t window) {
  int64_t longest = 0;
  for (int64_t seq = 0; seq < num_seqs; ++seq)
    longest = std::max<int64_t>(longest, lens[seq] - first_key(lens[seq], window));
  return longest;
}

struct KeyRange {
  int64_t begin;
  int64_t end;
};

// Part `part` of `parts` of a query's keys [first, len): whole runs of `align` tokens, empty past the last key.
inline KeyRange part_of_keys(int64_t first, int64_t len, int64_t parts, int64_t part, int64_t align) {
  const int64_t per = ((len - first + parts - 1) / parts + align - 1) / align * align;
  const int64_t begin = std::min(len, first + part * per);
  return {begin, std::min(len, begin + per)};
}

// One query head's output from its parts' outputs (part p's at outputs + p * stride, normalised over that part's
// keys) and statistics (stats[p * stats_stride]; an empty part has total 0): each part weighs its share of the
// whole softmax's sum, total * exp(peak - the largest peak). Parts are added in order, so the result does not
// depend on which thread attended which part. `scratch` holds parts + dim floats.
template <typename Out>
void merge_parts(const float* outputs, int64_t stride, const SoftmaxStats* stats, int64_t stats_stride, int64_t parts,
                 int64_t dim, Out* out, float* scratch) {
  float peak = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < parts; ++p)
    if (stats[p * stats_stride].total > 0.f) peak = std::max(peak, stats[p * stats_stride].peak);
  float* weights = scratch;
  float sum = 0.f;
  for (int64_t p = 0; p < parts; ++p) {
    const SoftmaxStats& part = stats[p * stats_stride];
    weights[p] = part.total > 0.f ? part.total * exp_nonpositive(part.peak - peak) : 0.f;
    sum += weights[p];
  }
  float* mixed = scratch + parts;
  std::fill(mixed, mixed + dim, 0.f);
  for (int64_t p = 0; p < parts; ++p) {
    if (weights[p] == 0.f) continue;  // an empty part's outputs were never written
    const float share = weights[p] / sum;
    for (int64_t d = 0; d < dim; ++d) mixed[d] += share * outputs[p * stride + d];
  }
  for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<Out>(mixed[d]);
}

// What the tasks of a call that splits its keys leave for the mix: for task t (unit t / parts, part t % parts) and
// each of its `heads` query heads, the part's fp32 output and softmax statistics. Holds nothing at one part.
class PartResults {
 public:
  PartResults(int64_t units, int64_t parts, int64_t heads, int64_t dim)
      : parts_(parts),
        heads_(heads),
        dim_(dim),
        outputs_(parts > 1 ? units * parts * heads * dim : 0),
        stats_(parts > 1 ? units * parts * heads : 0) {}

  float* output(int64_t task, int64_t head) { return &outputs_[(task * heads_ + head) * dim_]; }

  void record(int64_t task, int64_t head, SoftmaxStats stats) {
    if (parts_ > 1) stats_[task * heads_ + head] = stats;
  }

  // A part past a shorter sequence's keys.
  void record_empty(int64_t task) {
    for (int64_t h = 0; h < heads_ && parts_ > 1; ++h) stats_[task * heads_ + h] = {0.f, 0.f};
  }

  // Every unit's heads mixed into out_row(unit, head), once every task is done.
  template <typename OutRow>
  void merge(int64_t units, const OutRow& out_row) {
    scratch_.resize(parts_ + dim_);
    for (int64_t unit = 0; unit < units; ++unit)
      for (int64_t h = 0; h < heads_; ++h)
        merge_parts(&outputs_[(unit * parts_ * heads_ + h) * dim_], heads_ * dim_, &stats_[unit * parts_ * heads_ + h],
                    heads_, parts_, dim_, out_row(unit, h), scratch_.data());
  }

 private:
  int64_t parts_, heads_, dim_;
  std::vector<float> outputs_;
  std::vector<SoftmaxStats> stats_;
  std::vector<float> scratch_;  // a mix's part weights, then its fp32 sums: one allocation a call, not two a head
};

}  // namespace vigil
