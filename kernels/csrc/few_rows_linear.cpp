// y = x · Wᵀ for one to three rows of x (decoding a few sequences) and bf16 weights W [N, K], on the CPU. x is bf16
// [M, K], y bf16 [M, N]; sums are fp32.
//
// At one row, a decode step is bound by reading the weights. oneDNN's bf16 GEMM reached about half the machine's
// bandwidth there; this kernel reads each output's weights once, widens them in registers (a 16-bit shift) and
// runs every row against them, four independent accumulators a row so that the FMAs' latency stays hidden.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "simd_load.h"

namespace {

constexpr int64_t kMaxRows = 3;  // 3 rows x 4 accumulators + 4 weight registers fill the 16 AVX2 registers
constexpr int64_t kBlock = 32;   // input features per iteration: four registers of eight

// x is widened to fp32 once, not once per output.
template <int64_t R>
void few_rows_into(const float* x, int64_t ldx, const at::BFloat16* w, int64_t K, int64_t N, at::BFloat16* y) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const at::BFloat16* row = w + n * K;
#ifdef VIGIL_AVX2
      __m256 acc[R][4];
      for (auto& lanes : acc)
        for (auto& a : lanes) a = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; k += kBlock) {
        __m256 wv[4];
        for (int64_t i = 0; i < 4; ++i) wv[i] = vigil::load8(row + k + 8 * i);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < 4; ++i)
            acc[r][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + r * ldx + k + 8 * i), acc[r][i]);
      }
      for (int64_t r = 0; r < R; ++r) {
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
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

}  // namespace

at::Tensor few_rows_linear(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kBFloat16, "w must be bf16 [N, K]");
  const int64_t M = x.size(0), K = w.size(1), N = w.size(0);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == K, "x must be [rows, ", K, "], contiguous rows");
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "x must have 1 to ", kMaxRows, " rows");
  TORCH_CHECK(K % kBlock == 0, "input features must be a multiple of ", kBlock);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "x must be bf16");
  const at::Tensor wide = x.to(at::kFloat);
  auto y = at::empty({M, N}, x.options());
  const float* xp = wide.data_ptr<float>();
  const at::BFloat16* wp = w.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  if (M == 1) few_rows_into<1>(xp, wide.stride(0), wp, K, N, yp);
  else if (M == 2) few_rows_into<2>(xp, wide.stride(0), wp, K, N, yp);
  else few_rows_into<3>(xp, wide.stride(0), wp, K, N, yp);
  return y;
}
