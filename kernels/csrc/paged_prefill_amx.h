// Paged prefill attention on AMX tiles (paged_prefill_amx.cpp), for what paged_prefill_bf16 takes: bf16 queries
// over a bf16 or fp8 cache, head sizes a multiple of 32 up to 256.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "amx_tiles.h"

#ifdef VIGIL_AMX
namespace vigil {

// As paged_prefill_bf16; the caller has checked that the tiles are usable (amx::usable()).
at::Tensor paged_prefill_amx(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& tables, const std::vector<int64_t>& cu_seqlens,
                             const std::vector<int64_t>& seq_lens, double scale, int64_t window);

}  // namespace vigil
#endif
