// y = x · Wᵀ on AMX tiles, for bf16 x [M, K] and weights W [N, K] packed once by amx_pack_weight; y is bf16
// [M, N], its sums fp32.
//
// The packed layout: per 32 outputs (a column pair), per 32 inputs, two tiles of 16 rows x 64 bytes, one for
// each 16 outputs, whose row r holds every output's inputs 2r and 2r+1 (the bf16 pairs TDPBF16PS multiplies).
// A column pair's weights are thus one contiguous stream. Outputs past N, up to the next 32, are zero weights.
//
// A decode batch (tens of rows) reads each weight once per step, so most of the layer's time is reading the
// weights: the kernel streams each column pair once, multiplying it into every 32-row block of x while its tiles
// are in L1. oneDNN's bf16 GEMM over its own packed weights took about 1.3x as long on SmolLM2's layers at 64 rows.
// Up to 16 rows, x's rows fill one tile in place and each thread streams a fixed half of the pairs, two at a time
// (gate's and up's together in the gate/up kernel), prefetching as the few-rows kernel does: SmolLM2's layers took
// 0.71x the time of 32-row blocks at 1-16 rows, the output layer 0.89-0.92x (two Emerald Rapids cores, from L3).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "amx_pairs.h"
#include "amx_tiles.h"
#include "compile_time_rows.h"
#include "silu_mul.h"
#include "vector_math.h"

namespace {
constexpr int64_t kMaxFewRows = 8;  // rows amx_few_rows_linear takes
}  // namespace

#ifdef VIGIL_AMX
namespace {

using vigil::amx_layout::kBlock;
using vigil::amx_layout::kBlockBytes;
using vigil::amx_layout::kPair;
using vigil::amx_layout::kTileBytes;
// Threads take units of output columns a few at a time, as they finish: two at least, and a 64th of a wide
// layer's (the output layer: 24 column pairs, so that each row's outputs are written in longer runs; 0.94x the
// time of two at 64 rows).
constexpr int64_t kMinUnitsPerTask = 2;
constexpr int64_t kTasksOfWideLayer = 64;
// Rows of x up to which one tile holds them: a decode batch, whose tiles take its rows in place.
constexpr int64_t kTileRows = 16;

// A 16 x 16 fp32 tile from a stack buffer into up to 16 rows and the first `columns` of 16 outputs, as bf16.
void store_tile(const float* tile, at::BFloat16* y, int64_t ldy, int64_t rows, int64_t columns) {
  if (columns <= 0) return;
  const __mmask16 lanes = vigil::first_lanes(columns);
  for (int64_t r = 0; r < rows; ++r) vigil::store16(y + r * ldy, _mm512_load_ps(tile + 16 * r), lanes);
}

// SiLU(gate) * up of two 16 x 16 tiles of sums, each rounded to bf16 first as a bf16 GEMM's output would be:
// the same values as the GEMM followed by the silu_mul layer op.
void store_silu_mul(const float* gate, const float* up, at::BFloat16* y, int64_t ldy, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 g = vigil::round_to_bf16(_mm512_load_ps(gate + 16 * r));
    const __m512 u = vigil::round_to_bf16(_mm512_load_ps(up + 16 * r));
    vigil::store16(y + r * ldy, vigil::silu_mul16(g, u));
  }
}

// Two streams of 16-output tiles, one tile per 32 inputs, kBlockBytes apart; and where to prefetch from while
// reading them (a multiply_block's AheadBytes of each, per block).
struct TileStreams {
  const char* tiles[2];
  const char* ahead[2];
};

// Tiles 0-3 hold a product's sums, four 16 x 16 fp32 tiles.
void zero_sums() {
  vigil::amx::zero<0>();
  vigil::amx::zero<1>();
  vigil::amx::zero<2>();
  vigil::amx::zero<3>();
}

// Tiles 0 and 1 into sums[0] and sums[1], and, where `all` is true, tiles 2 and 3 into sums[2] and sums[3].
void store_sums(bool all, float (*sums)[256]) {
  vigil::amx::store<0>(sums[0], 64);
  vigil::amx::store<1>(sums[1], 64);
  if (!all) return;
  vigil::amx::store<2>(sums[2], 64);
  vigil::amx::store<3>(sums[3], 64);
}

// Sums of rows [0, 32) of `a` (rows lda apart) times the two streams' outputs, over `blocks` blocks of 32 inputs:
// sums[0] and sums[1] for rows 0-15, sums[2] and sums[3] for rows 16-31, which are left out where `lower` is
// false (x has no rows there). Where `next` is given, `next_step` bytes of it are fetched into L2 per block of
// inputs: part of the stream a later call will read.
template <int64_t AheadBytes>
void multiply_block(const at::BFloat16* a, int64_t lda, int64_t blocks, const TileStreams& b, bool prefetch,
                    const char* next, int64_t next_step, bool lower, float (*sums)[256]) {
  namespace amx = vigil::amx;
  zero_sums();
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(at::BFloat16));
  constexpr int64_t half = AheadBytes / 2;
  const int64_t quarter = next_step / 4;
  const auto fetch_next = [&](int64_t kb, int64_t part) {
    if (next) vigil::prefetch_lines<_MM_HINT_T1>(next + kb * next_step + part * quarter, quarter);
  };
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const at::BFloat16* a_top = a + kb * kBlock;
    const int64_t offset = kb * kBlockBytes;
    // While the first row block reads the streams, each product prefetches a quarter of a block's lines ahead:
    // all at once they stall on the core's outstanding-miss slots. Each product starts as soon as its two tiles
    // are in.
    amx::load<4>(a_top, a_stride);
    amx::load<6>(b.tiles[0] + offset, 64);
    if (prefetch) vigil::prefetch_lines(b.ahead[0] + offset, half);
    fetch_next(kb, 0);
    amx::multiply<0, 4, 6>();
    amx::load<7>(b.tiles[1] + offset, 64);
    if (prefetch) vigil::prefetch_lines(b.ahead[0] + offset + half, half);
    fetch_next(kb, 1);
    amx::multiply<1, 4, 7>();
    if (lower) amx::load<5>(a_top + 16 * lda, a_stride);
    if (prefetch) vigil::prefetch_lines(b.ahead[1] + offset, half);
    fetch_next(kb, 2);
    if (lower) amx::multiply<2, 5, 6>();
    if (prefetch) vigil::prefetch_lines(b.ahead[1] + offset + half, half);
    fetch_next(kb, 3);
    if (lower) amx::multiply<3, 5, 7>();
  }
  store_sums(lower, sums);
}

// Sums tile C += x's tile (4) times the weights' tile at `tile`, loaded into tile B, fetching ahead of it.
template <int C, int B, typename Fetch>
void multiply_by_tile(const char* tile, const Fetch& fetch) {
  vigil::amx::load<B>(tile, 64);
  fetch(tile);
  vigil::amx::multiply<C, 4, B>();
}

// Sums of M <= 16 rows of `a` (rows lda apart, the tiles configured for M rows) times one column pair's stream,
// or two: sums[0] and sums[1] the first's two 16-output tiles, sums[2] and sums[3] the second's. Each stream is
// read once, prefetched into L1 4 KB ahead and into L2 32 KB ahead up to `end`, as few_rows_over_tiles does:
// a decode batch reads every weight once, so the multiply waits on the stream and not on the tiles.
void multiply_streams(const at::BFloat16* a, int64_t lda, int64_t blocks, const char* first, const char* second,
                      const char* end, float (*sums)[256]) {
  namespace amx = vigil::amx;
  zero_sums();
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(at::BFloat16));
  const auto fetch = [end](const char* tile) {
    for (int64_t line = 0; line < kTileBytes; line += 64)
      vigil::prefetch_line_near_and_far<vigil::kPrefetchBytes, 8 * vigil::kPrefetchBytes>(tile + line, end);
  };
  for (int64_t kb = 0; kb < blocks; ++kb) {
    amx::load<4>(a + kb * kBlock, a_stride);
    const char* block = first + kb * kBlockBytes;
    multiply_by_tile<0, 5>(block, fetch);
    multiply_by_tile<1, 6>(block + kTileBytes, fetch);
    if (second == nullptr) continue;
    block = second + kb * kBlockBytes;
    multiply_by_tile<2, 7>(block, fetch);
    multiply_by_tile<3, 5>(block + kTileBytes, fetch);
  }
  store_sums(second != nullptr, sums);
}

// The unit a thread takes next, and the share of its weights a row block fetches while the current unit is read.
struct Coming {
  int64_t unit;   // -1: none
  int64_t part;   // this row block's share, of `parts`: its index among the unit's row blocks
  int64_t parts;  // the unit's row blocks

  // The bytes of a coming stream this row block fetches per block of inputs.
  int64_t step() const { return kBlockBytes / parts; }

  // Where this row block's share begins in the stream `streams_after` past the coming unit's (streams of `blocks`
  // blocks of inputs, packed from w); nullptr when no unit is coming.
  const char* share(const char* w, int64_t streams_after, int64_t blocks) const {
    return unit < 0 ? nullptr : w + (unit + streams_after) * blocks * kBlockBytes + part * blocks * step();
  }
};

// Runs block(unit, rows, lda, m, coming) for every 32-row block of x and every unit of output columns, the
// threads taking units as they finish; `rows` is x's (rows lda apart), or a zero-padded copy of the last fewer than
// 32 where there are more than 32 (up to 32, the tiles are configured for the rows there are). The row blocks of a
// unit fetch the next unit's weights into L2 between them, so that memory keeps reading while the tiles multiply
// what is in cache: before, only the first row block read from memory, and the others left it idle (over
// SmolLM2's layers, 0.85x the time at 64 rows, 0.92x at 512; the fused gate/up 0.81x at 64).
template <typename Block>
void for_each_block(const at::Tensor& x, int64_t units, const Block& block) {
  const int64_t M = x.size(0), K = x.size(1), full = M <= 32 ? M : M / 32 * 32;
  const at::BFloat16* rows = x.data_ptr<at::BFloat16>();
  // The copy in plain memory: as a tensor (zeros, then a copy) it cost 3-6 us a call, a tenth of a small layer's.
  std::vector<at::BFloat16> tail;
  if (full < M) {
    tail.assign(32 * K, at::BFloat16(0.f));
    for (int64_t r = full; r < M; ++r)
      std::memcpy(tail.data() + (r - full) * K, rows + r * x.stride(0), K * sizeof(at::BFloat16));
  }
  const int64_t row_blocks = (M + 31) / 32;
  std::atomic<int64_t> next{0};
  const int64_t per_task = std::max<int64_t>(kMinUnitsPerTask, units / kTasksOfWideLayer);
  vigil::amx::TileConfig config;
  const int64_t upper_rows = M < 16 ? M : 16, lower_rows = M > 16 && M < 32 ? M - 16 : 16;
  for (int tile : {0, 1, 4}) config.shape(tile, upper_rows, 64);
  for (int tile : {2, 3, 5}) config.shape(tile, lower_rows, 64);
  for (int tile : {6, 7}) config.shape(tile, 16, 64);
  // Threads take units as they finish rather than in fixed halves: two cores here do not run AMX at one rate.
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    vigil::amx::ScopedTiles tiles(config);
    for (int64_t first = next.fetch_add(per_task); first < units;) {
      const int64_t last = std::min(units, first + per_task);
      int64_t following = units;
      for (int64_t unit = first; unit < last; ++unit) {
        if (unit + 1 == last) following = next.fetch_add(per_task);  // claimed now, to be fetched ahead
        const int64_t coming = unit + 1 < last ? unit + 1 : following;
        for (int64_t b = 0; b < row_blocks; ++b) {
          const int64_t m = 32 * b;
          const at::BFloat16* a = m < full ? rows + m * x.stride(0) : tail.data();
          block(unit, a, m < full ? x.stride(0) : K, m, Coming{coming < units ? coming : -1, b, row_blocks});
        }
      }
      first = following;
    }
  });
}

// half(first, last) for the threads' fixed halves of [0, pairs) (in order, so that each reads one run of the
// streams), with the tiles configured for M <= 16 rows of x; none for no rows, which no tile can be shaped to.
template <typename Half>
void for_each_half(int64_t M, int64_t pairs, const Half& half) {
  if (M == 0) return;
  vigil::amx::TileConfig config;
  for (int tile : {0, 1, 2, 3, 4}) config.shape(tile, M, 64);
  for (int tile : {5, 6, 7}) config.shape(tile, 16, 64);
  at::parallel_for(0, pairs, 1, [&](int64_t first, int64_t last) {
    vigil::amx::ScopedTiles tiles(config);
    half(first, last);
  });
}

// One to kMaxFewRows rows over the same packed weights, without tiles: a 64-byte tile row holds 16 outputs'
// pairs of inputs, so one vdpbf16ps multiplies it by a row's pair broadcast to every lane, and 16 outputs' sums
// grow side by side with no horizontal sums. Each tile row read prefetches its line and the other tile's 4 KB
// ahead into L1 and 32 KB ahead into L2, spread through the block rather than in a burst (the L2 fetch: 0.85x the
// time at one or two rows, 0.92x at four, 0.98x at six).
template <int64_t R>
void few_rows_over_tiles(const at::BFloat16* x, int64_t ldx, const char* w, int64_t K, int64_t N, at::BFloat16* y) {
  const int64_t blocks = K / kBlock, pairs = (N + kPair - 1) / kPair;
  at::parallel_for(0, pairs, 1, [&](int64_t first, int64_t last) {
    const char* end = w + last * blocks * kBlockBytes;
    for (int64_t p = first; p < last; ++p) {
      const char* stream = w + p * blocks * kBlockBytes;
      __m512 sums[R][2][2];  // row, tile, and two chains per tile so that the adds overlap
      for (auto& row : sums)
        for (auto& tile : row)
          for (auto& chain : tile) chain = _mm512_setzero_ps();
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const char* block = stream + kb * kBlockBytes;
        const char* ahead = block + vigil::kPrefetchBytes;
        const char* far = block + 8 * vigil::kPrefetchBytes;
        const auto* pairs_of_x = reinterpret_cast<const int32_t*>(x + kb * kBlock);
#pragma GCC unroll 16
        for (int64_t t = 0; t < 16; ++t) {
          if (ahead + 64 * t < end) {
            _mm_prefetch(ahead + 64 * t, _MM_HINT_T0);
            _mm_prefetch(ahead + kTileBytes + 64 * t, _MM_HINT_T0);
          }
          if (far + 64 * t < end) {
            _mm_prefetch(far + 64 * t, _MM_HINT_T1);
            _mm_prefetch(far + kTileBytes + 64 * t, _MM_HINT_T1);
          }
          const auto w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(block + 64 * t));
          const auto w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(block + kTileBytes + 64 * t));
          for (int64_t r = 0; r < R; ++r) {
            const auto pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pairs_of_x[r * ldx / 2 + t]));
            sums[r][0][t & 1] = _mm512_dpbf16_ps(sums[r][0][t & 1], w0, pair);
            sums[r][1][t & 1] = _mm512_dpbf16_ps(sums[r][1][t & 1], w1, pair);
          }
        }
      }
      for (int64_t r = 0; r < R; ++r)
        for (int64_t tile = 0; tile < 2; ++tile) {
          const int64_t column = p * kPair + tile * 16;
          if (column >= N) continue;
          vigil::store16(y + r * N + column, _mm512_add_ps(sums[r][tile][0], sums[r][tile][1]),
                         vigil::first_lanes(N - column));
        }
    }
  });
}

}  // namespace
#endif

at::Tensor amx_pack_weight(at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "w must be bf16 [N, K]");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % 32 == 0, "input features must be a multiple of 32");
  const int64_t pairs = (N + 31) / 32, blocks = K / 32;
  // [pair, block, tile, row, output, input of the pair]
  auto padded = at::zeros({pairs * 32, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({pairs, 2, 16, blocks, 16, 2}).permute({0, 3, 1, 4, 2, 5}).contiguous();
}

bool amx_linear_usable() {
#ifdef VIGIL_AMX
  return vigil::amx::usable();
#else
  return false;
#endif
}

namespace {

// The input features of packed weights that x can be multiplied by; refuses what the kernels cannot take.
int64_t checked_inputs(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(amx_linear_usable(), "this build or process cannot use AMX tiles");
  TORCH_CHECK(packed.dim() == 6 && packed.is_contiguous() && packed.scalar_type() == at::kBFloat16,
              "packed must come from amx_pack_weight");
  const int64_t K = packed.size(1) * 32;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.size(1) == K && x.stride(1) == 1 &&
                  (x.size(0) <= 1 || x.stride(0) >= K),
              "x must be bf16 [rows, ", K, "], contiguous rows");
  return K;
}

// Packed weights hold their outputs rounded up to whole column pairs of 32.
void check_out_features(const at::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(out_features > (packed.size(0) - 1) * 32 && out_features <= packed.size(0) * 32,
              "out_features does not match packed");
}

}  // namespace

#ifdef VIGIL_AMX
namespace {

// Rows [m, m + 32) of y's column pair p, [M, N]: a (rows lda apart) times the pair's stream, which the first row
// block prefetches ahead (and each fetches its share of `coming`'s stream, where given) as multiply_block does.
void multiply_pair(const char* stream, const at::BFloat16* a, int64_t lda, int64_t blocks, bool prefetch,
                   const char* coming, int64_t coming_step, at::BFloat16* y, int64_t M, int64_t N, int64_t m,
                   int64_t p) {
  const int64_t ahead = vigil::kPrefetchBytes;
  const TileStreams b{{stream, stream + kTileBytes}, {stream + ahead, stream + ahead + kTileBytes}};
  alignas(64) float sums[4][256];
  const int64_t rows = std::min<int64_t>(32, M - m), top = std::min<int64_t>(16, rows);
  multiply_block<kTileBytes>(a, lda, blocks, b, prefetch, coming, coming_step, rows > 16, sums);
  const int64_t columns = std::min<int64_t>(kPair, N - p * kPair);
  at::BFloat16* y_block = y + m * N + p * kPair;
  store_tile(sums[0], y_block, N, top, columns);
  store_tile(sums[1], y_block + 16, N, top, columns - 16);
  if (rows > 16) {
    store_tile(sums[2], y_block + 16 * N, N, rows - 16, columns);
    store_tile(sums[3], y_block + 16 * N + 16, N, rows - 16, columns - 16);
  }
}

}  // namespace

at::Tensor vigil::amx_linear_over_pairs(const at::Tensor& x, int64_t N, const WritePair& write_pair) {
  const int64_t M = x.size(0), blocks = x.size(1) / kBlock, stream_bytes = blocks * kBlockBytes;
  auto y = at::empty({M, N}, x.options());
  // A thread writes a pair's stream when it takes the pair (its first row block); the other row blocks read it
  // from L2.
  auto streams = at::empty({at::get_num_threads(), stream_bytes}, at::TensorOptions().dtype(at::kByte));
  char* const first_stream = static_cast<char*>(streams.data_ptr());
  at::BFloat16* out = y.data_ptr<at::BFloat16>();
  for_each_block(x, (N + 31) / 32, [&](int64_t p, const at::BFloat16* a, int64_t lda, int64_t m,
                                        const Coming& coming) {
    char* stream = first_stream + at::get_thread_num() * stream_bytes;
    if (coming.part == 0) write_pair(p, stream);
    multiply_pair(stream, a, lda, blocks, false, nullptr, 0, out, M, N, m, p);
  });
  return y;
}
#endif

at::Tensor amx_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  const int64_t K = checked_inputs(x, packed), M = x.size(0), N = out_features;
  check_out_features(packed, N);
  auto y = at::empty({M, N}, x.options());
#ifdef VIGIL_AMX
  const char* w = static_cast<const char*>(packed.data_ptr());
  at::BFloat16* out = y.data_ptr<at::BFloat16>();
  const int64_t blocks = K / kBlock, pairs = (N + 31) / 32, pair_bytes = blocks * kBlockBytes;
  if (M <= kTileRows) {
    // Two column pairs at a time, so that each load of x's tile serves four products.
    const at::BFloat16* rows = x.data_ptr<at::BFloat16>();
    for_each_half(M, pairs, [&](int64_t first, int64_t last) {
      const char* end = w + last * pair_bytes;
      for (int64_t p = first; p < last; p += 2) {
        const char* stream = w + p * pair_bytes;
        alignas(64) float sums[4][256];
        multiply_streams(rows, x.stride(0), blocks, stream, p + 1 < last ? stream + pair_bytes : nullptr, end, sums);
        for (int64_t q = p; q < std::min(last, p + 2); ++q) {
          const int64_t columns = std::min<int64_t>(kPair, N - q * kPair);
          store_tile(sums[2 * (q - p)], out + q * kPair, N, M, columns);
          store_tile(sums[2 * (q - p) + 1], out + q * kPair + 16, N, M, columns - 16);
        }
      }
    });
    return y;
  }
  for_each_block(x, pairs, [&](int64_t p, const at::BFloat16* a, int64_t lda, int64_t m, const Coming& coming) {
    multiply_pair(w + p * pair_bytes, a, lda, blocks, coming.part == 0, coming.share(w, 0, blocks), coming.step(),
                  out, M, N, m, p);
  });
#endif
  return y;
}

// SiLU(gate) * up of a gate/up layer, whose weights stack gate's rows on up's: y [M, I] for weights [2I, K]
// packed by amx_pack_weight, with I a multiple of 32. Gate's column pair p and up's, p + I/32, are read together
// a 16-output tile at a time, and the activation is applied to their sums while they are in cache, instead of
// storing the [M, 2I] product for the silu_mul layer op to read back.
at::Tensor amx_silu_mul_linear(at::Tensor x, at::Tensor packed, int64_t intermediate) {
  const int64_t K = checked_inputs(x, packed), M = x.size(0), I = intermediate;
  TORCH_CHECK(I % 32 == 0 && packed.size(0) * 32 == 2 * I,
              "packed must hold 2 x intermediate outputs, a multiple of 32");
  auto y = at::empty({M, I}, x.options());
#ifdef VIGIL_AMX
  const char* w = static_cast<const char*>(packed.data_ptr());
  at::BFloat16* out = y.data_ptr<at::BFloat16>();
  const int64_t blocks = K / kBlock, pair_bytes = blocks * kBlockBytes, pairs = I / kPair;
  if (M <= kTileRows) {
    // Gate's and up's pair in one pass, each stream read once.
    const at::BFloat16* rows = x.data_ptr<at::BFloat16>();
    for_each_half(M, pairs, [&](int64_t first, int64_t last) {
      const char* end = w + (pairs + last) * pair_bytes;
      for (int64_t p = first; p < last; ++p) {
        alignas(64) float sums[4][256];
        multiply_streams(rows, x.stride(0), blocks, w + p * pair_bytes, w + (pairs + p) * pair_bytes, end, sums);
        store_silu_mul(sums[0], sums[2], out + p * kPair, I, M);
        store_silu_mul(sums[1], sums[3], out + p * kPair + 16, I, M);
      }
    });
    return y;
  }
  for_each_block(x, pairs, [&](int64_t p, const at::BFloat16* a, int64_t lda, int64_t m, const Coming& coming) {
    const char* gate = w + p * pair_bytes;
    const char* up = w + (p + pairs) * pair_bytes;
    const int64_t ahead = vigil::kPrefetchBytes;
    const int64_t rows = std::min<int64_t>(32, M - m), top = std::min<int64_t>(16, rows);
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t tile = half * kTileBytes;
      // The first half's pass prefetches both streams whole; the second reads them from cache.
      const TileStreams b{{gate + tile, up + tile}, {gate + ahead, up + ahead}};
      alignas(64) float sums[4][256];
      // The first half fetches its share of the coming unit's gate stream, the second of its up stream.
      multiply_block<kBlockBytes>(a, lda, blocks, b, coming.part == 0 && half == 0,
                                  coming.share(w, half * pairs, blocks), coming.step(), rows > 16, sums);
      at::BFloat16* y_block = out + m * I + p * kPair + half * 16;
      store_silu_mul(sums[0], sums[1], y_block, I, top);
      if (rows > 16) store_silu_mul(sums[2], sums[3], y_block + 16 * I, I, rows - 16);
    }
  });
#endif
  return y;
}

// y = x · Wᵀ for one to eight rows over weights packed by amx_pack_weight, so that a layer needs no plain copy
// for decoding few sequences. Against few_rows_linear over plain weights, SmolLM2's layers and output layer:
// 0.94x the time at one row, 0.97x at two and four, 0.91x at six.
at::Tensor amx_few_rows_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  const int64_t K = checked_inputs(x, packed), M = x.size(0), N = out_features;
  check_out_features(packed, N);
  TORCH_CHECK(M >= 1 && M <= kMaxFewRows && (M == 1 || x.stride(0) % 2 == 0),
              "x must have 1 to 8 rows, an even number of values apart");
  auto y = at::empty({M, N}, x.options());
#ifdef VIGIL_AMX
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();  // rows read as int32 pairs of inputs
  const char* w = static_cast<const char*>(packed.data_ptr());
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  vigil::with_rows<kMaxFewRows>(
      M, [&](auto rows) { few_rows_over_tiles<decltype(rows)::value>(xp, x.stride(0), w, K, N, yp); });
#endif
  return y;
}
