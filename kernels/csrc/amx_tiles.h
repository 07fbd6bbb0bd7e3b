// AMX tiles for the kernels that use them: permission to use them, their configuration, and the tile instructions
// with their tile numbers as template arguments. VIGIL_AMX names a build (-march=native) that may use them.
#pragma once

#include "simd_load.h"

#if defined(VIGIL_AVX512_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define VIGIL_AMX 1

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace vigil::amx {

// Linux hands the tile registers to a process only once it asks for them (arch_prctl ARCH_REQ_XCOMP_PERM with
// XFEATURE_XTILEDATA); torch asks too, when oneDNN first runs an AMX kernel.
inline bool usable() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

// LDTILECFG's 64 bytes: palette 1, and each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};

  void shape(int tile, int64_t tile_rows, int64_t row_bytes) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    bytes_per_row[tile] = static_cast<uint16_t>(row_bytes);
  }
};

// Loads a configuration for the life of a scope and then puts back the thread's own (oneDNN's, or none).
class ScopedTiles {
 public:
  explicit ScopedTiles(const TileConfig& config) {
    _tile_storeconfig(saved_);
    _tile_loadconfig(&config);
  }
  ~ScopedTiles() {
    if (saved_[0] != 0)
      _tile_loadconfig(saved_);
    else
      _tile_release();
  }
  ScopedTiles(const ScopedTiles&) = delete;
  ScopedTiles& operator=(const ScopedTiles&) = delete;

 private:
  alignas(64) uint8_t saved_[64];
};

// The compiler's tile intrinsics name their tiles by macro arguments and do not tell it that they read or write
// memory; these take template arguments and do.
template <int Tile>
inline void load(const void* from, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(from), "r"(stride), "n"(Tile) : "memory");
}

template <int Tile>
inline void store(void* to, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(to), "r"(stride), "n"(Tile) : "memory");
}

template <int Tile>
inline void zero() {
  asm volatile("tilezero %%tmm%c0" ::"n"(Tile));
}

// tile C += tile A x tile B, in bf16 pairs summed in fp32.
template <int C, int A, int B>
inline void multiply() {
  asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}

#ifdef __AMX_INT8__
// tile C += tile A x tile B, in signed bytes multiplied four by four and summed in int32.
template <int C, int A, int B>
inline void multiply_bytes() {
  asm volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}

// The same with tile A's bytes unsigned.
template <int C, int A, int B>
inline void multiply_unsigned_bytes() {
  asm volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}
#endif

}  // namespace vigil::amx

#endif
