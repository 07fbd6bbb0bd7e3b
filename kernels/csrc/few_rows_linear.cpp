// y = x · Wᵀ for one to 32 rows of x (decoding a few sequences, or one with its speculative guesses), eight a pass,
// and bf16 weights W [N, K], on the CPU. x is bf16 [M, K], y bf16 [M, N]; sums are fp32.
//
// At one row, a decode step is bound by reading the weights. oneDNN's bf16 GEMM reached about half the machine's
// bandwidth there; this kernel reads each output's weights once and runs every row against them: with AVX512-BF16
// dot products of bf16 pairs, else with the weights widened in registers (a 16-bit shift).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "amx_tiles.h"
#include "compile_time_rows.h"
#include "simd_load.h"

namespace {

constexpr int64_t kMaxRows = 8;        // rows a pass over the weights
constexpr int64_t kAcceptedRows = 32;  // rows a call, in passes
constexpr int64_t kBlock = 32;  // input features must come in multiples of this

// Independent accumulators per row, so that enough FMA chains are in flight to hide their latency (about four)
// while rows x accumulators + weight registers fit the 16 AVX2 registers.
constexpr int64_t accumulators(int64_t rows) { return rows <= 3 ? 4 : rows <= 5 ? 2 : 1; }

// x is widened to fp32 once, not once per output.
template <int64_t R, int64_t A, bool IntoL2>
void few_rows_into(const float* x, int64_t ldx, const at::BFloat16* w, int64_t K, int64_t N, at::BFloat16* y) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    const at::BFloat16* end = w + last * K;
    for (int64_t n = first; n < last; ++n) {
      const at::BFloat16* row = w + n * K;
#ifdef VIGIL_AVX2
      __m256 acc[R][A];
      for (auto& lanes : acc)
        for (auto& a : lanes) a = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; k += 8 * A) {
        // Where it pays, a line at a time near and far, as the AVX512-BF16 kernel below: 0.63-0.68x the time at
        // one to four rows on two Xeon cores, from L3.
        if (IntoL2 && k % 32 == 0) vigil::prefetch_ahead_near_and_far(row + k, 64, end);
        __m256 wv[A];
        for (int64_t i = 0; i < A; ++i) wv[i] = vigil::load8(row + k + 8 * i);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < A; ++i)
            acc[r][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + r * ldx + k + 8 * i), acc[r][i]);
      }
      for (int64_t r = 0; r < R; ++r) {
        __m256 sum = acc[r][0];
        for (int64_t i = 1; i < A; ++i) sum = _mm256_add_ps(sum, acc[r][i]);
        y[r * N + n] = static_cast<at::BFloat16>(vigil::horizontal_sum(sum));
      }
#else
      for (int64_t r = 0; r < R; ++r) {
        float sum = 0.f;
        for (int64_t k = 0; k < K; ++k) sum += x[r * ldx + k] * static_cast<float>(row[k]);
        y[r * N + n] = static_cast<at::BFloat16>(sum);
      }
#endif
    }
  });
}

#ifdef VIGIL_AVX512_BF16
// With AVX512-BF16, one instruction multiplies 32 bf16 pairs and adds them into 16 fp32 lanes: x stays in bf16
// and the arithmetic per weight is a quarter of the widening path's, which lets more rows run at memory speed.
// Rows x accumulators + weights within the 32 AVX-512 registers.
constexpr int64_t dot_accumulators(int64_t rows) { return rows <= 2 ? 4 : 2; }

template <bool IntoL2>
inline void prefetch_weights(const at::BFloat16* from, int64_t bytes, const at::BFloat16* end) {
  if constexpr (IntoL2) vigil::prefetch_ahead_near_and_far(from, bytes, end);
  else vigil::prefetch_ahead(from, bytes, end);
}

template <int64_t R, int64_t A, bool IntoL2>
void few_rows_dot_bf16(const at::BFloat16* x, int64_t ldx, const at::BFloat16* w, int64_t K, int64_t N,
                       at::BFloat16* y) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    const at::BFloat16* end = w + last * K;
    for (int64_t n = first; n < last; ++n) {
      const at::BFloat16* row = w + n * K;
      __m512 acc[R][A];
      for (auto& lanes : acc)
        for (auto& a : lanes) a = _mm512_setzero_ps();
      int64_t k = 0;
      for (; k + 32 * A <= K; k += 32 * A) {
        // Each step prefetches as many lines as it reads, not a whole row's at once: a row's burst stalls on the
        // core's outstanding-miss slots (4 and 8 rows: 8-11% slower on two Xeon cores; one row alike). Where it
        // pays, the lines 32 KB ahead go to L2 too: SmolLM2's layers 0.77-0.88x the time at one to eight rows there.
        prefetch_weights<IntoL2>(row + k, 64 * A, end);
        __m512bh wv[A];
        for (int64_t i = 0; i < A; ++i) wv[i] = (__m512bh)_mm512_loadu_si512(row + k + 32 * i);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < A; ++i)
            acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv[i], (__m512bh)_mm512_loadu_si512(x + r * ldx + k + 32 * i));
      }
      for (; k < K; k += 32) {
        prefetch_weights<IntoL2>(row + k, 64, end);
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(row + k);
        for (int64_t r = 0; r < R; ++r)
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], wv, (__m512bh)_mm512_loadu_si512(x + r * ldx + k));
      }
      for (int64_t r = 0; r < R; ++r) {
        __m512 sum = acc[r][0];
        for (int64_t i = 1; i < A; ++i) sum = _mm512_add_ps(sum, acc[r][i]);
        y[r * N + n] = static_cast<at::BFloat16>(_mm512_reduce_add_ps(sum));
      }
    }
  });
}
#endif

}  // namespace

// The rows up to which this kernel beats a bf16 GEMM (measured on SmolLM2's shapes): with AVX512-BF16, oneDNN's
// by 1.7-1.9x at eight rows, and, eight rows a pass, up to 32: on two Zen 5 cores SmolLM2's 120 layers took 0.53x
// oneDNN's time at 9 rows, 0.67x at 16, 0.90x at 32 and 1.04x at 48 (oneDNN packs the weights on every call);
// widening, by 1.1-1.3x at four and even at five. Where AMX tiles serve, layers keep only their tile layout
// (amx_linear.cpp): its few-rows kernel serves up to three rows, and its AMX kernel from four, where it takes x's
// rows in one tile (on two Emerald Rapids cores, SmolLM2's layers and output layer from L3: 1.00x the few-rows
// kernel's time at three rows, 0.94-0.97x at four and five, 0.88-0.90x at six, 0.79x at eight).
int64_t few_rows_limit() {
#ifdef VIGIL_AMX
  if (vigil::amx::usable()) return 3;
#endif
#ifdef VIGIL_AVX512_BF16
  return kAcceptedRows;
#else
  return 4;
#endif
}

namespace {

at::Tensor checked_output(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kBFloat16, "w must be bf16 [N, K]");
  const int64_t K = w.size(1);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == K, "x must be [rows, ", K, "], contiguous rows");
  TORCH_CHECK(K % kBlock == 0, "input features must be a multiple of ", kBlock);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "x must be bf16");
  return at::empty({x.size(0), w.size(0)}, x.options());
}

// Runs kernel<R, A> over x's rows in slices of at most kMaxRows; A is each row's accumulators, or, where Fixed
// is false, the kernel's own choice for the slice's row count.
template <bool Fixed, int64_t A>
void in_row_slices(const at::Tensor& x, const at::Tensor& w, at::Tensor& y) {
  const int64_t M = x.size(0), K = w.size(1), N = w.size(0);
  const at::BFloat16* wp = w.data_ptr<at::BFloat16>();
  const bool into_l2 = vigil::l2_prefetch_pays();
#ifndef VIGIL_AVX512_BF16
  const at::Tensor xs = x.to(at::kFloat);
  const float* xp = xs.data_ptr<float>();
#else
  const at::Tensor& xs = x;
  const at::BFloat16* xp = xs.data_ptr<at::BFloat16>();
#endif
  for (int64_t first = 0; first < M; first += kMaxRows) {
    at::BFloat16* yp = y.data_ptr<at::BFloat16>() + first * N;
    const auto* xr = xp + first * xs.stride(0);
    vigil::with_rows<kMaxRows>(std::min(kMaxRows, M - first), [&](auto rows) {
      constexpr int64_t R = decltype(rows)::value;
      vigil::with_flag(into_l2, [&](auto l2) {
        constexpr bool IntoL2 = decltype(l2)::value;
#ifdef VIGIL_AVX512_BF16
        few_rows_dot_bf16<R, Fixed ? A : dot_accumulators(R), IntoL2>(xr, xs.stride(0), wp, K, N, yp);
#else
        few_rows_into<R, Fixed ? A : accumulators(R), IntoL2>(xr, xs.stride(0), wp, K, N, yp);
#endif
      });
    });
  }
}

}  // namespace

at::Tensor few_rows_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kAcceptedRows, "x must have 1 to ", kAcceptedRows, " rows");
  auto y = checked_output(x, w);
  in_row_slices<false, 1>(x, w, y);
  return y;
}

// Any number of rows, each summed in one fixed order whatever the row count: a row's result does not depend on
// the rows beside it (batch-invariant mode). The accumulators are those of the kernel's widest slice.
at::Tensor row_invariant_linear(at::Tensor x, at::Tensor w) {
  auto y = checked_output(x, w);
  if (x.size(0) == 0) return y;
#ifdef VIGIL_AVX512_BF16
  in_row_slices<true, dot_accumulators(kMaxRows)>(x, w, y);
#else
  in_row_slices<true, accumulators(kMaxRows)>(x, w, y);
#endif
  return y;
}
