// AVX-512 F (x86-64-v4): float32 FMA over weights widened to float32 in the decoded panel.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

namespace uform {
namespace avx512 {

constexpr int64_t NR = 32, MR = 12, MC = 192, PAIR = 1, KC = 256;

static inline int64_t depth(const Gemm& g) { return g.k; }
using Panel = float;

#include "decode_f32.inc"

static inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

template <int R>
static inline void micro(const Gemm& g, int64_t row, int64_t n0, const Panel* panel, int64_t begin, int64_t end,
                         bool first, bool last) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  const __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16);
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    const float* y = g.y + (row + r) * g.n + n0;
    acc[r][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, y);
    acc[r][1] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, y + 16);
  }
  const float* x = g.x + row * g.k;
  for (int64_t i = begin; i < end; ++i) {
    const __m512 b0 = _mm512_load_ps(panel + i * NR);
    const __m512 b1 = _mm512_load_ps(panel + i * NR + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * g.k + i]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  const bool scaled = last && g.scale, biased = last && g.bias;
  const __m512 s0 = scaled ? _mm512_maskz_loadu_ps(m0, g.scale + n0) : _mm512_set1_ps(1.0f);
  const __m512 s1 = scaled ? _mm512_maskz_loadu_ps(m1, g.scale + n0 + 16) : _mm512_set1_ps(1.0f);
  const __m512 c0 = biased ? _mm512_maskz_loadu_ps(m0, g.bias + n0) : _mm512_setzero_ps();
  const __m512 c1 = biased ? _mm512_maskz_loadu_ps(m1, g.bias + n0 + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    float* y = g.y + (row + r) * g.n + n0;
    _mm512_mask_storeu_ps(y, m0, _mm512_fmadd_ps(acc[r][0], s0, c0));
    _mm512_mask_storeu_ps(y + 16, m1, _mm512_fmadd_ps(acc[r][1], s1, c1));
  }
}

#include "tiling.inc"

}  // namespace avx512

const Kernel kernel_avx512 = {"avx512", avx512::NR, avx512::PAIR, avx512::MC, false, avx512::task, nullptr};

}  // namespace uform
