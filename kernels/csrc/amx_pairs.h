// AMX tiles over weights that are not kept in amx_linear.cpp's packed layout (quantised ones): each column pair of
// 32 outputs is written into that layout when a thread takes it, into a buffer of the thread's own that stays in
// L2 while every 32-row block of x is multiplied by it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "amx_tiles.h"
#include "transpose16.h"

#ifdef VIGIL_AMX
namespace vigil {

// The packed layout's sizes (amx_linear.cpp describes the layout).
namespace amx_layout {
constexpr int64_t kPair = 32;         // outputs a column pair holds
constexpr int64_t kBlock = 32;        // inputs a tile's rows hold, in pairs
constexpr int64_t kTileBytes = 1024;  // 16 rows x 64 bytes
constexpr int64_t kBlockBytes = 2 * kTileBytes;
}  // namespace amx_layout

// Writes column pair `pair`'s packed stream: its K/32 blocks of two 16 x 64-byte tiles.
using WritePair = std::function<void(int64_t pair, char* stream)>;

// y = x · Wᵀ for bf16 x [M, K] and W [N, K] as write_pair makes it; y is bf16 [M, N], its sums fp32.
at::Tensor amx_linear_over_pairs(const at::Tensor& x, int64_t N, const WritePair& write_pair);

// Column pair `pair` of N outputs in the packed layout, from block(n, b): output n's inputs 32b to 32b + 31 as
// bf16 in one vector. A tile's row r holds its 16 outputs' inputs 2r and 2r + 1, so the 16 outputs' vectors are
// transposed as 32-bit pairs. Outputs past N are zero.
template <typename Block>
void write_pair_stream(int64_t pair, int64_t N, int64_t blocks, const Block& block, char* stream) {
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t tile = 0; tile < 2; ++tile) {
      const int64_t first = pair * amx_layout::kPair + tile * 16;
      __m512i rows[16];
      for (int64_t o = 0; o < 16; ++o) rows[o] = first + o < N ? block(first + o, b) : _mm512_setzero_si512();
      transpose16(rows);
      char* out = stream + b * amx_layout::kBlockBytes + tile * amx_layout::kTileBytes;
      for (int64_t r = 0; r < 16; ++r) _mm512_storeu_si512(out + 64 * r, rows[r]);
    }
}

}  // namespace vigil
#endif
