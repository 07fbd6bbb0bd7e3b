// y = x · Wᵀ on AMX tiles, for bf16 x [M, K] and weights W [N, K] packed once by amx_pack_weight; y is bf16
// [M, N], its sums fp32.
//
// The packed layout: per 32 outputs (a column pair), per 32 inputs, two tiles of 16 rows x 64 bytes, one for
// each 16 outputs, whose row r holds every output's inputs 2r and 2r+1 (the bf16 pairs TDPBF16PS multiplies).
// A column pair's weights are thus one contiguous stream. Outputs past N, up to the next 32, are zero weights.
//
// A decode batch (tens of rows) reads each weight once per step, so the layer is bound by reading the weights:
// the kernel streams each column pair once, multiplying it into every 32-row block of x while its tiles are
// in L1. oneDNN's bf16 GEMM over its own packed weights took about 1.3x as long on SmolLM2's layers at 64 rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "amx_tiles.h"

#ifdef VIGIL_AMX
namespace {

constexpr int64_t kPair = 32;            // outputs a column pair holds
constexpr int64_t kBlock = 32;           // inputs a tile's rows hold, in pairs
constexpr int64_t kTileBytes = 1024;     // 16 rows x 64 bytes
constexpr int64_t kBlockBytes = 2 * kTileBytes;
// Threads take pairs a few at a time, as they finish: two at least, and a 64th of a wide layer's (the output
// layer: 24 pairs, so that each row's outputs are written in longer runs; 0.94x the time of two at 64 rows).
constexpr int64_t kMinPairsPerTask = 2;
constexpr int64_t kTasksOfWideLayer = 64;

// A 16 x 16 fp32 tile from a stack buffer into up to 16 rows and the first `columns` of 16 outputs, as bf16.
void store_tile(const float* tile, at::BFloat16* y, int64_t ldy, int64_t rows, int64_t columns) {
  if (columns <= 0) return;
  const __mmask16 lanes = columns >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << columns) - 1);
  for (int64_t r = 0; r < rows; ++r) vigil::store16(y + r * ldy, _mm512_load_ps(tile + 16 * r), lanes);
}

struct Problem {
  const at::BFloat16* x;
  int64_t ldx;
  const char* w;  // packed
  int64_t K, N, M;
  at::BFloat16* y;
};

// Rows [m, m + 32) of x (a zero-padded copy when fewer are left) times column pair p, into y.
void multiply_block(const Problem& P, const at::BFloat16* a, int64_t lda, int64_t p, int64_t m, bool prefetch) {
  namespace amx = vigil::amx;
  const int64_t blocks = P.K / kBlock;
  const char* stream = P.w + p * blocks * kBlockBytes;
  amx::zero<0>();
  amx::zero<1>();
  amx::zero<2>();
  amx::zero<3>();
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(at::BFloat16));
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const at::BFloat16* a_top = a + kb * kBlock;
    const char* b = stream + kb * kBlockBytes;
    // While the first row block reads the stream, each product prefetches a quarter of a block's lines,
    // vigil::kPrefetchBytes ahead: all 32 at once stall on the core's outstanding-miss slots. Each product
    // starts as soon as its two tiles are in.
    const char* ahead = b + vigil::kPrefetchBytes;
    amx::load<4>(a_top, a_stride);
    amx::load<6>(b, 64);
    if (prefetch) vigil::prefetch_lines(ahead, 512);
    amx::multiply<0, 4, 6>();
    amx::load<7>(b + kTileBytes, 64);
    if (prefetch) vigil::prefetch_lines(ahead + 512, 512);
    amx::multiply<1, 4, 7>();
    amx::load<5>(a_top + 16 * lda, a_stride);
    if (prefetch) vigil::prefetch_lines(ahead + 1024, 512);
    amx::multiply<2, 5, 6>();
    if (prefetch) vigil::prefetch_lines(ahead + 1536, 512);
    amx::multiply<3, 5, 7>();
  }
  alignas(64) float tiles[4][256];
  amx::store<0>(tiles[0], 64);
  amx::store<1>(tiles[1], 64);
  amx::store<2>(tiles[2], 64);
  amx::store<3>(tiles[3], 64);
  const int64_t rows = std::min<int64_t>(32, P.M - m), top = std::min<int64_t>(16, rows);
  const int64_t columns = std::min<int64_t>(kPair, P.N - p * kPair);
  at::BFloat16* out = P.y + m * P.N + p * kPair;
  store_tile(tiles[0], out, P.N, top, columns);
  store_tile(tiles[1], out + 16, P.N, top, columns - 16);
  if (rows > 16) {
    store_tile(tiles[2], out + 16 * P.N, P.N, rows - 16, columns);
    store_tile(tiles[3], out + 16 * P.N + 16, P.N, rows - 16, columns - 16);
  }
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

at::Tensor amx_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  TORCH_CHECK(amx_linear_usable(), "this build or process cannot use AMX tiles");
  TORCH_CHECK(packed.dim() == 6 && packed.is_contiguous() && packed.scalar_type() == at::kBFloat16,
              "packed must come from amx_pack_weight");
  const int64_t M = x.size(0), K = packed.size(1) * 32, N = out_features;
  TORCH_CHECK(N > (packed.size(0) - 1) * 32 && N <= packed.size(0) * 32, "out_features does not match packed");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.size(1) == K && x.stride(1) == 1 &&
                  (M <= 1 || x.stride(0) >= K),
              "x must be bf16 [rows, ", K, "], contiguous rows");
  auto y = at::empty({M, N}, x.options());
#ifdef VIGIL_AMX
  const Problem P{x.data_ptr<at::BFloat16>(), x.stride(0), static_cast<const char*>(packed.data_ptr()), K, N, M,
                  y.data_ptr<at::BFloat16>()};
  const int64_t full = M / 32 * 32;
  // The rows after the last full 32, in a zero-padded block.
  at::Tensor tail;
  if (full < M) {
    tail = at::zeros({32, K}, x.options());
    tail.narrow(0, 0, M - full).copy_(x.narrow(0, full, M - full));
  }
  const int64_t pairs = (N + 31) / 32;
  std::atomic<int64_t> next{0};
  const int64_t per_task = std::max<int64_t>(kMinPairsPerTask, pairs / kTasksOfWideLayer);
  vigil::amx::TileConfig config;
  for (int tile = 0; tile < 8; ++tile) config.shape(tile, 16, 64);
  // Threads take pairs as they finish rather than in fixed halves: two cores here do not run AMX at one rate.
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    vigil::amx::ScopedTiles tiles(config);
    for (int64_t first; (first = next.fetch_add(per_task)) < pairs;) {
      for (int64_t p = first; p < std::min(pairs, first + per_task); ++p) {
        for (int64_t m = 0; m < full; m += 32) multiply_block(P, P.x + m * P.ldx, P.ldx, p, m, m == 0);
        if (full < M) multiply_block(P, tail.data_ptr<at::BFloat16>(), K, p, full, full == 0);
      }
    }
  });
#endif
  return y;
}
