// Paged prefill attention on AMX tiles: flash attention's loop, for bf16 queries over a bf16 or fp8 cache.
//
// First each sequence's keys and values are gathered, per KV head, from their blocks into buffers laid out for the
// tiles: keys as rows [key, dim], from which a tile of 16 keys x 32 dims loads as it is, and values transposed in
// pairs of keys [32-key step, 16 dims, 16 key pairs] (tiles of Vᵀ). A task is then 16 rows of one sequence and KV
// head, a row a new token and one of the query heads that share the KV head (so a decoding sequence, a one-token
// chunk in batch-invariant mode, fills a tile's `group` lanes and not one). For each 32 keys it takes Sᵀ = K·Qᵀ on
// the tiles, rows keys and lanes the task's rows, so that the online softmax is
// vector arithmetic down the rows with no horizontal reductions; the probabilities, rounded to bf16 and
// interleaved in key pairs, are the B tile of Oᵀ += Vᵀ·Pᵀ, summed in fp32 (in the tiles themselves at 64
// dimensions) and rescaled when a token's reference maximum moves (OnlineSoftmax). A task reads the keys up to its
// last token, from the window of its first.
//
// On two Emerald Rapids cores, SmolLM2's heads (9 over 3 KV heads of 64), one layer: 0.16x the time of the
// AVX512-BF16 kernel (paged_prefill_bf16.cpp) for the last 464 tokens of a 2000-token prompt, 0.21x for 512 fresh
// tokens and 0.38x for 128; 0.47x and 0.63x torch's flash attention for 512 and 128 fresh tokens. Half its time
// is the softmax's vector arithmetic; keeping the output's tiles in registers (64 dimensions), moving a reference
// only past kLazy, and 2^x by vscalefps took it from 0.24x to 0.16x of the AVX512-BF16 kernel's time.
#include "paged_prefill_amx.h"

#ifdef VIGIL_AMX

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "paged_attention_bf16.h"
#include "transpose16.h"

namespace vigil {
namespace {

using bf16 = at::BFloat16;

constexpr int64_t kRows = 16;    // (token, query head) rows a task takes: the lanes of its tiles
constexpr int64_t kStep = 32;    // keys scored at a time: two tiles of 16 rows
constexpr int64_t kTile = 256;   // 32-bit elements of a tile: 16 rows x 64 bytes
constexpr float kLazy = 8.f;     // how far (log2) a token's scores may pass its reference before it moves

// 2^x for x >= -100 (2^-100 below): Taylor's polynomial of degree 4 on [-1/2, 1/2], within 5e-5 relative, finer
// than the bf16 the probabilities are rounded to.
inline __m512 pow2(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(9.6181291e-3f);
  for (const float c : {5.5504109e-2f, 2.4022651e-1f, 6.9314718e-1f, 1.f})
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// A task's online softmax over its 16 lanes (a token and a query head each), in log2 units: each lane's reference,
// the score it last moved to, and its sum of 2^(score - reference). A reference moves only when a score passes it by
// more than kLazy, so that most steps leave the accumulated outputs alone; whether a lane moves depends on its own
// scores alone, so its sums do not depend on which rows share its tile.
struct OnlineSoftmax {
  __m512 reference = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 total = _mm512_setzero_ps();

  // A step's scores (kStep rows of 16 lanes, unscaled) to probabilities, bf16 key pairs [16 pairs, 16 lanes];
  // `seen` masks each row's lanes (nullptr: every key is seen by every lane). Returns the factor by which each
  // lane's accumulated output must be multiplied, and whether any is not 1.
  __m512 step(const float* scores, const __mmask16* seen, float scale, __m512i interleave, int32_t* probabilities,
              bool& moved) {
    const __m512 scaled = _mm512_set1_ps(scale);
    __m512 peak = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < kStep; ++r) {
      const __m512 score = _mm512_load_ps(scores + 16 * r);
      peak = seen ? _mm512_mask_max_ps(peak, seen[r], peak, score) : _mm512_max_ps(peak, score);
    }
    peak = _mm512_mul_ps(peak, scaled);  // scale > 0
    const __mmask16 passes = _mm512_cmp_ps_mask(peak, _mm512_add_ps(reference, _mm512_set1_ps(kLazy)), _CMP_GT_OQ);
    const __m512 moved_to = _mm512_mask_mov_ps(reference, passes, peak);
    const __mmask16 holding = passes & _mm512_cmp_ps_mask(
        reference, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ);
    const __m512 factor =
        _mm512_mask_mov_ps(_mm512_set1_ps(1.f), holding, pow2(_mm512_sub_ps(reference, moved_to)));
    moved = holding != 0;
    total = _mm512_mul_ps(total, factor);
    reference = moved_to;
    // Tokens that have seen no key keep -inf, whose lanes are masked off below.
    for (int64_t j = 0; j < 16; ++j) {
      __m512 pair[2];
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t r = 2 * j + half;
        const __m512 p = pow2(_mm512_fmsub_ps(_mm512_load_ps(scores + 16 * r), scaled, reference));
        pair[half] = seen ? _mm512_maskz_mov_ps(seen[r], p) : p;
      }
      total = _mm512_add_ps(total, _mm512_add_ps(pair[0], pair[1]));
      const __m512i bf16_pairs = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(pair[1], pair[0]));
      _mm512_store_si512(probabilities + 16 * j, _mm512_permutexvar_epi16(interleave, bf16_pairs));
    }
    return factor;
  }
};

// Multiplies the 16 x 16 fp32 rows at `rows` by the factor of each lane.
inline void rescale_rows(float* rows, __m512 factor) {
  for (int64_t d = 0; d < 16; ++d) _mm512_store_ps(rows + 16 * d, _mm512_mul_ps(_mm512_load_ps(rows + 16 * d), factor));
}

// 16 cache values as bf16 bits; fp8 values are exact in bf16.
inline __m256i bf16_bits(const bf16* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

template <typename Fp8>
inline __m256i bf16_bits(const Fp8* p) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(load16(p)));
}

// A sequence's gathered keys: the position of the first, the steps of kStep keys per KV head (keys past the
// context are zero), and where KV head 0's steps begin; head h's follow `steps` later.
struct Gathered {
  int64_t first_key;
  int64_t steps;
  int64_t offset;
};

// Keys [first, end) of one KV head (end - first <= kStep) into a step of the gathered buffers: `keys` kStep rows
// of dim, `values` dim / 16 tiles whose row d holds, for each key pair j, values 2j and 2j + 1 of dimension d.
template <typename Cache>
void gather_step(const Cache* k_head, const Cache* v_head, const int32_t* table, int64_t block_size,
                 int64_t block_stride, int64_t token_stride, int64_t first, int64_t end, int64_t dim, bf16* keys,
                 int32_t* values) {
  const Cache* key_rows[kStep];
  const Cache* value_rows[kStep];
  for (int64_t r = 0; r < kStep; ++r) {
    const int64_t position = first + r;
    if (position >= end) {
      key_rows[r] = value_rows[r] = nullptr;
      continue;
    }
    const int64_t offset = table[position / block_size] * block_stride + position % block_size * token_stride;
    key_rows[r] = k_head + offset;
    value_rows[r] = v_head + offset;
  }
  const auto sixteen = [](const Cache* row, int64_t d) { return row ? bf16_bits(row + d) : _mm256_setzero_si256(); };
  for (int64_t r = 0; r < kStep; ++r)
    for (int64_t d = 0; d < dim; d += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + r * dim + d), sixteen(key_rows[r], d));
  for (int64_t group = 0; group < dim / 16; ++group) {
    __m512i pairs[16];
    for (int64_t j = 0; j < 16; ++j) {
      const __m512i even = _mm512_cvtepu16_epi32(sixteen(value_rows[2 * j], 16 * group));
      const __m512i odd = _mm512_cvtepu16_epi32(sixteen(value_rows[2 * j + 1], 16 * group));
      pairs[j] = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));
    }
    transpose16(pairs);
    for (int64_t d = 0; d < 16; ++d) _mm512_storeu_si512(values + group * kTile + d * 16, pairs[d]);
  }
}

// Rows first_row.. of a sequence's new tokens times the query heads of KV head kv_head: row r is token r / group
// and query head kv_head * group + r % group.
struct Task {
  int64_t seq;
  int64_t kv_head;
  int64_t first_row;
};

}  // namespace

at::Tensor paged_prefill_amx(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& tables, const std::vector<int64_t>& cu_seqlens,
                             const std::vector<int64_t>& seq_lens, double scale, int64_t window) {
  const int64_t num_heads = q.size(1), dim = q.size(2), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, vectors = dim / 32, dim_groups = dim / 16;
  const int64_t num_seqs = static_cast<int64_t>(seq_lens.size());
  auto out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));

  std::vector<Gathered> gathered(num_seqs);
  std::vector<Task> tasks;  // each sequence's later tiles first: they read the most keys
  int64_t total_steps = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t num_new = cu_seqlens[s + 1] - cu_seqlens[s], first_new = seq_lens[s] - num_new;
    // Steps begin at multiples of kStep whatever the chunk, so that a token's keys are summed in the same order
    // however its prompt is chunked (the batch-invariant backend relies on it).
    const int64_t first_key = window > 0 ? std::max<int64_t>(0, first_new - window + 1) / kStep * kStep : 0;
    const int64_t steps = num_new > 0 ? (seq_lens[s] - first_key + kStep - 1) / kStep : 0;
    gathered[s] = {first_key, steps, total_steps};
    total_steps += steps * num_kv_heads;
    const int64_t rows = num_new * group;
    for (int64_t first = rows - 1 - (rows - 1) % kRows; first >= 0 && rows > 0; first -= kRows)
      for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head) tasks.push_back({s, kv_head, first});
  }
  if (total_steps == 0) return out;

  const int64_t step_values = kStep * dim;  // bf16 values of a step's keys, and of its values
  auto keys = at::empty({total_steps * step_values}, q.options().memory_format(at::MemoryFormat::Contiguous));
  auto values = at::empty_like(keys);
  bf16* const keys_ptr = keys.data_ptr<bf16>();
  bf16* const values_ptr = values.data_ptr<bf16>();
  std::vector<int64_t> offsets(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) offsets[s] = gathered[s].offset;
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  with_bf16_kernel_cache(k_cache.scalar_type(), [&](auto cache_type) {
    using Cache = decltype(cache_type);
    const Cache* k_ptr = k_cache.data_ptr<Cache>();
    const Cache* v_ptr = v_cache.data_ptr<Cache>();
    at::parallel_for(0, total_steps, 4, [&](int64_t begin, int64_t end) {
      for (int64_t index = begin; index < end; ++index) {
        // The last sequence whose steps begin at or before index (a sequence with none shares its offset).
        const int64_t s = std::upper_bound(offsets.begin(), offsets.end(), index) - offsets.begin() - 1;
        const Gathered& g = gathered[s];
        const int64_t head = (index - g.offset) / g.steps, step = (index - g.offset) % g.steps;
        const int64_t first = g.first_key + step * kStep;
        gather_step(k_ptr + head * k_cache.stride(2), v_ptr + head * v_cache.stride(2),
                    table_ptr + s * tables.size(1), k_cache.size(1), k_cache.stride(0), k_cache.stride(1), first,
                    std::min(first + kStep, seq_lens[s]), dim, keys_ptr + index * step_values,
                    reinterpret_cast<int32_t*>(values_ptr + index * step_values));
      }
    });
  });

  const bf16* q_ptr = q.data_ptr<bf16>();
  bf16* out_ptr = out.data_ptr<bf16>();
  const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // scores in log2 units
  // With 64 dimensions the output's four tiles stay in tile registers from a task's first step to its last.
  const bool resident = dim_groups == 4;
  const int64_t key_stride = dim * static_cast<int64_t>(sizeof(bf16));
  amx::TileConfig config;
  for (int tile = 0; tile < 8; ++tile) config.shape(tile, 16, 64);
  alignas(64) static constexpr int16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                          21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                          11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  TaskQueue queue(static_cast<int64_t>(tasks.size()));
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    amx::ScopedTiles tiles(config);
    alignas(64) int32_t query_tiles[8 * kTile];  // Qᵀ, one tile per 32 dims: row r holds each lane's pair r
    alignas(64) float scores[2 * kTile];         // Sᵀ: row r is key r's score for each lane
    alignas(64) int32_t probabilities[kTile];    // Pᵀ in key pairs
    alignas(64) float sums[kTile];
    alignas(64) float acc[256 * 16];  // Oᵀ: row d is dimension d of each lane's output
    for (int64_t index = queue.take(); index < queue.count(); index = queue.take()) {
      const Task& task = tasks[index];
      const int64_t num_new = cu_seqlens[task.seq + 1] - cu_seqlens[task.seq];
      const int64_t rows = std::min(kRows, num_new * group - task.first_row);
      const int64_t first_new = seq_lens[task.seq] - num_new;  // the position of the sequence's first new token
      const Gathered& g = gathered[task.seq];
      const int64_t base = g.offset + task.kv_head * g.steps;
      // Lanes past the task's rows repeat its last one, so that every lane sees a key.
      alignas(64) int32_t lane_positions[kRows];
      const bf16* query_rows[kRows];
      bf16* out_rows[kRows];
      for (int64_t n = 0; n < kRows; ++n) {
        const int64_t row = task.first_row + std::min(n, rows - 1), token = row / group;
        const int64_t head = task.kv_head * group + row % group;
        lane_positions[n] = static_cast<int32_t>(first_new + token);
        query_rows[n] = q_ptr + (cu_seqlens[task.seq] + token) * q.stride(0) + head * q.stride(1);
        out_rows[n] = out_ptr + (cu_seqlens[task.seq] + token) * out.stride(0) + head * out.stride(1);
      }

      for (int64_t c = 0; c < vectors; ++c) {
        __m512i tile_rows[16];
        for (int64_t n = 0; n < 16; ++n)
          tile_rows[n] = n < rows ? _mm512_loadu_si512(query_rows[n] + 32 * c) : _mm512_setzero_si512();
        transpose16(tile_rows);
        for (int64_t r = 0; r < 16; ++r) _mm512_store_si512(query_tiles + c * kTile + 16 * r, tile_rows[r]);
      }
      const __m512i positions = _mm512_load_si512(lane_positions);
      const __m512i window_start = _mm512_sub_epi32(positions, _mm512_set1_epi32(static_cast<int32_t>(window)));
      const int64_t first_position = lane_positions[0], last_position = lane_positions[kRows - 1];
      const int64_t lowest = window > 0 ? std::max(g.first_key, first_position - window + 1) : g.first_key;
      const int64_t first_step = (lowest - g.first_key) / kStep;
      const int64_t end_step = (last_position + 1 - g.first_key + kStep - 1) / kStep;

      OnlineSoftmax softmax;
      if (resident) {
        amx::zero<2>();
        amx::zero<3>();
        amx::zero<4>();
        amx::zero<5>();
      } else {
        std::fill(acc, acc + dim * 16, 0.f);
      }
      for (int64_t step = first_step; step < end_step; ++step) {
        const bf16* key_tile = keys_ptr + (base + step) * step_values;
        amx::zero<0>();
        amx::zero<1>();
        for (int64_t c = 0; c < vectors; ++c) {
          amx::load<7>(query_tiles + c * kTile, 64);
          amx::load<6>(key_tile + 32 * c, key_stride);
          amx::multiply<0, 6, 7>();
          amx::load<6>(key_tile + 16 * dim + 32 * c, key_stride);
          amx::multiply<1, 6, 7>();
        }
        amx::store<0>(scores, 64);
        amx::store<1>(scores + kTile, 64);

        const int64_t first_key = g.first_key + step * kStep;
        const bool whole = first_key + kStep - 1 <= first_position && (window <= 0 || first_key > last_position - window);
        __mmask16 seen[kStep];
        if (!whole)
          for (int64_t r = 0; r < kStep; ++r) {
            const __m512i key = _mm512_set1_epi32(static_cast<int32_t>(first_key + r));
            seen[r] = _mm512_cmp_epi32_mask(key, positions, _MM_CMPINT_LE);
            if (window > 0) seen[r] &= _mm512_cmp_epi32_mask(key, window_start, _MM_CMPINT_NLE);
          }
        bool moved = false;
        const __m512 factor = softmax.step(scores, whole ? nullptr : seen, scale_log2, interleave, probabilities, moved);

        amx::load<7>(probabilities, 64);
        const int32_t* value_tiles = reinterpret_cast<const int32_t*>(values_ptr + (base + step) * step_values);
        if (resident) {
          if (moved) {
            amx::store<2>(acc, 64);
            amx::store<3>(acc + kTile, 64);
            amx::store<4>(acc + 2 * kTile, 64);
            amx::store<5>(acc + 3 * kTile, 64);
            for (int64_t dg = 0; dg < 4; ++dg) rescale_rows(acc + dg * kTile, factor);
            amx::load<2>(acc, 64);
            amx::load<3>(acc + kTile, 64);
            amx::load<4>(acc + 2 * kTile, 64);
            amx::load<5>(acc + 3 * kTile, 64);
          }
          amx::load<6>(value_tiles, 64);
          amx::multiply<2, 6, 7>();
          amx::load<6>(value_tiles + kTile, 64);
          amx::multiply<3, 6, 7>();
          amx::load<6>(value_tiles + 2 * kTile, 64);
          amx::multiply<4, 6, 7>();
          amx::load<6>(value_tiles + 3 * kTile, 64);
          amx::multiply<5, 6, 7>();
          continue;
        }
        for (int64_t dg = 0; dg < dim_groups; ++dg) {
          float* rows = acc + dg * kTile;
          if (moved) rescale_rows(rows, factor);
          amx::zero<2>();
          amx::load<6>(value_tiles + dg * kTile, 64);
          amx::multiply<2, 6, 7>();
          amx::store<2>(sums, 64);
          for (int64_t d = 0; d < 16; ++d)
            _mm512_store_ps(rows + 16 * d, _mm512_add_ps(_mm512_load_ps(rows + 16 * d), _mm512_load_ps(sums + 16 * d)));
        }
      }
      if (resident) {
        amx::store<2>(acc, 64);
        amx::store<3>(acc + kTile, 64);
        amx::store<4>(acc + 2 * kTile, 64);
        amx::store<5>(acc + 3 * kTile, 64);
      }

      const __m512 inverse = _mm512_div_ps(_mm512_set1_ps(1.f), softmax.total);
      for (int64_t dg = 0; dg < dim_groups; ++dg) {
        __m512i outputs[16];
        for (int64_t d = 0; d < 16; ++d)
          outputs[d] = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(acc + dg * kTile + 16 * d), inverse));
        transpose16(outputs);
        for (int64_t n = 0; n < rows; ++n) store16(out_rows[n] + 16 * dg, _mm512_castsi512_ps(outputs[n]));
      }
    }
  });
  return out;
}

}  // namespace vigil

#endif
