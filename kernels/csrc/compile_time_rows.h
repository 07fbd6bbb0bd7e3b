// A row count known only at run time, turned into a compile-time constant so that a kernel's per-row accumulators
// stay in registers: with_rows<Max>(M, run) calls run(std::integral_constant<int64_t, M>{}) for 1 <= M <= Max.
// with_flag does the same for a choice: run(std::true_type{}) or run(std::false_type{}).
#pragma once

#include <cstdint>
#include <type_traits>

namespace vigil {

template <int64_t R, typename Run>
void with_rows(int64_t M, const Run& run) {
  if constexpr (R > 1) {
    if (M < R) return with_rows<R - 1>(M, run);
  }
  run(std::integral_constant<int64_t, R>{});
}

template <typename Run>
void with_flag(bool flag, const Run& run) {
  if (flag)
    run(std::true_type{});
  else
    run(std::false_type{});
}

}  // namespace vigil
