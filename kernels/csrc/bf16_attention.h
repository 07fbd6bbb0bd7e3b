// What the bf16 attention kernels (paged_decode_bf16.cpp, paged_prefill_bf16.cpp) share, on CPUs with
// AVX512-BF16 (Zen 4, Xeons since Cooper Lake), over a bf16 or an fp8 cache (Cache, the cache's element type).
// Keys are not widened to fp32 before the dot products: vdpbf16ps multiplies bf16 pairs exactly and sums in fp32,
// and fp8 keys become bf16 exactly. Scores of 16 tokens are kept as 16 vectors of partial sums and
// added across in one tree, instead of one horizontal sum per token and query row. The weighted sum of values
// widens each value row once and adds it into fp32 accumulators held in registers for up to four query rows,
// written out in bf16.
#pragma once

#include "simd_load.h"

#ifdef VIGIL_AVX512_BF16

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "compile_time_rows.h"
#include "vector_math.h"

namespace vigil::bf16_attention {

using bf16 = at::BFloat16;
constexpr int kChunk = 16;          // tokens whose scores one tree of additions finishes
constexpr int64_t kMaxVectors = 8;  // head_dim up to 256, in 32s

// Lane i of the result is the sum of v[i]'s 16 lanes.
inline __m512 lane_sums(const __m512* v) {
  __m512 halves[8], quarters[4], eighths[2];
  // [v0 q0+q2, v0 q1+q3, v1 q0+q2, v1 q1+q3] in 128-bit quarters
  for (int i = 0; i < 8; ++i)
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  // each quarter: four partial sums of one of four vectors
  for (int i = 0; i < 4; ++i)
    quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    eighths[i] = _mm512_add_ps(_mm512_unpacklo_ps(quarters[2 * i], quarters[2 * i + 1]),
                               _mm512_unpackhi_ps(quarters[2 * i], quarters[2 * i + 1]));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(eighths[0], eighths[1], 0x44),
                                    _mm512_shuffle_ps(eighths[0], eighths[1], 0xEE));
  // The tree leaves vector 4j + q's sum in lane 4q + j.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

// Where the keys and values of the tokens a query sees lie in the caches: rows[t] for its t-th token, found once
// per sequence by walking its block table (no division per token and head).
inline void token_rows(const int32_t* table, int64_t first, int64_t len, int64_t block_size, int64_t block_stride,
                       int64_t token_stride, std::vector<int64_t>& rows) {
  rows.resize(len - first);
  int64_t block = first / block_size, offset = first % block_size;
  for (int64_t t = 0; t < len - first; ++t) {
    rows[t] = table[block] * block_stride + offset * token_stride;
    if (++offset == block_size) offset = 0, ++block;
  }
}

// scores[0:n] = scale * q . K[rows[0:n]] for one query head and up to 16 tokens; q is `vectors` x 32 bf16. rows
// holds 16 entries, those past n repeating a valid row.
template <int64_t Vectors, typename Cache>
inline void key_scores(const Cache* keys, const int64_t* rows, int n, const __m512bh* q, float scale,
                       float* scores) {
  __m512 partial[kChunk];
  for (int i = 0; i < kChunk; ++i) {
    const Cache* row = keys + rows[i];
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < Vectors; ++j) acc = _mm512_dpbf16_ps(acc, q[j], load32_bf16(row + 32 * j));
    partial[i] = acc;
  }
  const __m512 sums = _mm512_mul_ps(lane_sums(partial), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(scores, first_lanes(n), sums);
}

// Blocks lie anywhere in the pool, so no hardware prefetcher finds the next one: while one chunk of tokens is
// read, the rows of the next are fetched (`bytes` of each, every KV head of the task).
template <typename Cache>
inline void prefetch_rows(const Cache* cache, const int64_t* rows, int n, int64_t bytes) {
  for (int i = 0; i < n; ++i) prefetch_lines(cache + rows[i], bytes);
}

// The block holding a sequence's token `token` (block_stride elements, every KV head), fetched into L2 well ahead of
// its first read.
template <typename Cache>
inline void prefetch_block(const Cache* cache, const int32_t* table, int64_t token, int64_t block_size,
                           int64_t block_stride) {
  prefetch_lines<_MM_HINT_T2>(cache + table[token / block_size] * block_stride,
                              block_stride * static_cast<int64_t>(sizeof(Cache)));
}

// out[h][c:c+16*Vectors] = sum over t of weights[h][t] * V[t][c:c+16*Vectors] for `Heads` query heads sharing
// these values, rounded once at the end to the output's type (bf16, or fp32 for a part of the keys). The
// accumulators are one flat array under int loops unrolled by pragma: as [Heads][Vectors] under int64_t loops, GCC
// 12 kept them in registers but also stored all of them to the stack on every token (12 stores of 64 bytes against
// 12 FMAs). Each row is fetched a chunk ahead: `ahead_bytes` of it from `values`, or where that is 0 the columns
// read.
template <int Heads, int Vectors, typename Cache, typename Out>
void weighted_values(const Cache* values, const int64_t* rows, int64_t span, const float* weights, int64_t column,
                     Out* const* out, int64_t ahead_bytes) {
  __m512 acc[Heads * Vectors];
#pragma GCC unroll 16
  for (int i = 0; i < Heads * Vectors; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < span; ++t) {
    const Cache* row = values + rows[t] + column;
    if (t + kChunk < span) {
      if (ahead_bytes > 0)
        prefetch_lines(values + rows[t + kChunk], ahead_bytes);
      else
#pragma GCC unroll 4
        for (int k = 0; k < Vectors; k += 2)
          _mm_prefetch(reinterpret_cast<const char*>(values + rows[t + kChunk] + column + 16 * k), _MM_HINT_T0);
    }
    __m512 v[Vectors];
#pragma GCC unroll 4
    for (int k = 0; k < Vectors; ++k) v[k] = load16_unscaled(row + 16 * k);
#pragma GCC unroll 4
    for (int h = 0; h < Heads; ++h) {
      const __m512 w = _mm512_set1_ps(weights[h * span + t]);
#pragma GCC unroll 4
      for (int k = 0; k < Vectors; ++k) acc[h * Vectors + k] = _mm512_fmadd_ps(w, v[k], acc[h * Vectors + k]);
    }
  }
  const __m512 factor = _mm512_set1_ps(unscaled_factor<Cache>);
#pragma GCC unroll 16
  for (int i = 0; i < Heads * Vectors; ++i)
    store16(out[i / Vectors] + column + 16 * (i % Vectors), _mm512_mul_ps(acc[i], factor));
}

// The value pass of query rows that share their values (a KV head's query heads, with each row's weights over the
// span), in runs of up to four rows and 64 (else 32) columns. A task over several KV heads passes `ahead_bytes`,
// its rows' bytes, in its first head's pass: that pass then fetches whole rows ahead, and the other heads' passes
// find theirs in cache. Fetching only the columns read, each head's pass went to memory for its own (on two Zen 5
// cores, a single stream's int8 decode step at about 4,000 tokens of context took 0.96-0.97x the time with whole
// rows; eight streams 1.00x).
template <typename Cache, typename Out>
inline void weighted_values(const Cache* values, const int64_t* rows, int64_t span, const float* weights,
                            int64_t heads, int64_t dim, Out* const* out, int64_t ahead_bytes = 0) {
  for (int64_t h = 0; h < heads; h += 4) {
    for (int64_t column = 0; column < dim;) {
      const bool wide = dim - column >= 64, first = h == 0 && column == 0;
      with_rows<4>(std::min<int64_t>(4, heads - h), [&](auto heads_c) {
        constexpr int64_t run = decltype(heads_c)::value;
        if (wide)
          weighted_values<run, 4>(values, rows, span, weights + h * span, column, out + h, first ? ahead_bytes : 0);
        else
          weighted_values<run, 2>(values, rows, span, weights + h * span, column, out + h, first ? ahead_bytes : 0);
      });
      column += wide ? 64 : 32;
    }
  }
}

// A thread's working memory for score_rows: the queries as bf16 pairs, a chunk of fp8 keys widened to bf16, and
// which of a chunk's rows each query row prefetches.
struct ScoreScratch {
  std::vector<__m512bh> query;
  std::vector<bf16> keys;
  std::vector<int> prefetch_shares;
};

// to[0:n] = from[0:n] in bf16, n a multiple of 32.
template <typename Cache>
inline void widen_to_bf16(const Cache* from, int64_t n, bf16* to) {
  for (int64_t i = 0; i < n; i += 32) _mm512_storeu_si512(to + i, reinterpret_cast<__m512i>(load32_bf16(from + i)));
}

// The value rows rows[0:span] of an fp8 cache (dim each), widened to bf16 into `to` at rows t * dim, for kernels
// that read each value row many times.
template <typename Cache>
inline void widen_values(const Cache* values, const int64_t* rows, int64_t span, int64_t dim, std::vector<bf16>& to) {
  to.resize(span * dim);
  for (int64_t t = 0; t < span; ++t) widen_to_bf16(values + rows[t], dim, to.data() + t * dim);
}

template <int64_t Vectors, typename Cache>
void score_rows(const bf16* const* queries, const Cache* const* keys, int64_t count, const int64_t* rows,
                int64_t span, float scale, const Cache* prefetched, int64_t row_bytes, ScoreScratch& scratch,
                float* scores) {
  std::vector<__m512bh>& query = scratch.query;
  query.resize(count * Vectors);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t j = 0; j < Vectors; ++j)
      query[r * Vectors + j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(queries[r] + 32 * j));
  // Each key row is read by every query row that shares it: an fp8 chunk is widened once, into chunk rows of
  // `run` elements (all of row_bytes), and the rows read it there.
  const int64_t run = row_bytes / static_cast<int64_t>(sizeof(Cache));
  int64_t chunk_rows[kChunk];
  if constexpr (!std::is_same_v<Cache, bf16>) {
    scratch.keys.resize(kChunk * run);
    for (int i = 0; i < kChunk; ++i) chunk_rows[i] = i * run;
  }
  // The next chunk's rows are fetched a few at a time between this chunk's reads, not all at once: a burst of
  // prefetches stalls on the core's few outstanding-miss slots and holds up the reads behind it (7-9% of decode
  // attention from memory, on two Xeon cores). Query row r fetches rows shares[r] to shares[r + 1] of a whole chunk.
  std::vector<int>& shares = scratch.prefetch_shares;
  shares.resize(count + 1);
  for (int64_t r = 0; r <= count; ++r) shares[r] = static_cast<int>(kChunk * r / count);
  for (int64_t start = 0; start < span; start += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, span - start));
    const int ahead = static_cast<int>(std::clamp<int64_t>(span - start - kChunk, 0, kChunk));
    const int64_t* next = rows + std::min<int64_t>(start + kChunk, span);
    if constexpr (std::is_same_v<Cache, bf16>) {
      const int64_t* chunk = rows + start;
      if (n < kChunk) {  // the last rows, repeated up to 16
        for (int i = 0; i < kChunk; ++i) chunk_rows[i] = rows[start + std::min(i, n - 1)];
        chunk = chunk_rows;
      }
      for (int64_t r = 0; r < count; ++r) {
        const int from = std::min(shares[r], ahead), to = std::min(shares[r + 1], ahead);
        prefetch_rows(prefetched, next + from, to - from, row_bytes);
        key_scores<Vectors>(keys[r], chunk, n, &query[r * Vectors], scale, scores + r * span + start);
      }
    } else {
      for (int i = 0; i < n; ++i) {
        if (i < ahead) prefetch_rows(prefetched, next + i, 1, row_bytes);
        widen_to_bf16(prefetched + rows[start + i], run, &scratch.keys[i * run]);
      }
      for (int64_t r = 0; r < count; ++r)
        key_scores<Vectors>(scratch.keys.data() + (keys[r] - prefetched), chunk_rows, n, &query[r * Vectors], scale,
                            scores + r * span + start);
    }
  }
}

// scores[r * span + t] = scale * q_r . K_r[rows[t]] for `count` query rows, q_r at queries[r] (`vectors` x 32 bf16)
// against the keys at keys[r], over the span's tokens, 16 at a time; the next 16 tokens' rows (`row_bytes` of each
// from prefetched, which holds every keys[r]) are fetched meanwhile. row_bytes is a multiple of 32 elements.
template <typename Cache>
inline void score_rows(const bf16* const* queries, const Cache* const* keys, int64_t count, const int64_t* rows,
                       int64_t span, int64_t vectors, float scale, const Cache* prefetched, int64_t row_bytes,
                       ScoreScratch& scratch, float* scores) {
  with_rows<kMaxVectors>(vectors, [&](auto vectors_c) {
    score_rows<decltype(vectors_c)::value>(queries, keys, count, rows, span, scale, prefetched, row_bytes, scratch,
                                           scores);
  });
}

}  // namespace vigil::bf16_attention

#endif
