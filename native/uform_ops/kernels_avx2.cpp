// AVX2 with FMA (x86-64-v3): float32 FMA over weights widened to float32 in the decoded panel.
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

namespace uform {
namespace avx2 {

constexpr int64_t NR = 16, MR = 6, MC = 192, PAIR = 1;
using Panel = float;

#include "decode_f32.inc"

template <int R>
static inline void micro(const Gemm& g, int64_t row, int64_t n0, const Panel* panel) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* x = g.x + row * g.k;
  for (int64_t i = 0; i < g.k; ++i) {
    const __m256 b0 = _mm256_load_ps(panel + i * NR);
    const __m256 b1 = _mm256_load_ps(panel + i * NR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * g.k + i);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  alignas(32) float s[NR], c[NR], out[NR];
  for (int64_t j = 0; j < NR; ++j) {
    s[j] = g.scale && j < cols ? g.scale[n0 + j] : 1.0f;
    c[j] = g.bias && j < cols ? g.bias[n0 + j] : 0.0f;
  }
  const __m256 s0 = _mm256_load_ps(s), s1 = _mm256_load_ps(s + 8);
  const __m256 c0 = _mm256_load_ps(c), c1 = _mm256_load_ps(c + 8);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* y = g.y + (row + r) * g.n + n0;
    const __m256 v0 = _mm256_fmadd_ps(acc[r][0], s0, c0), v1 = _mm256_fmadd_ps(acc[r][1], s1, c1);
    if (cols == NR) {
      _mm256_storeu_ps(y, v0);
      _mm256_storeu_ps(y + 8, v1);
    } else {
      _mm256_store_ps(out, v0);
      _mm256_store_ps(out + 8, v1);
      std::memcpy(y, out, size_t(cols) * 4);
    }
  }
}

#include "tiling.inc"

}  // namespace avx2

const Kernel kernel_avx2 = {"avx2", avx2::NR, avx2::PAIR, avx2::MC, false, avx2::task, nullptr};

}  // namespace uform
