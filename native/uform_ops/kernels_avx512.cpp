// AVX-512 F (x86-64-v4): float32 FMA over weights widened to float32 in the decoded panel.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

namespace uform {
namespace avx512 {

constexpr int64_t NR = 32, MR = 12, MC = 192, PAIR = 1, KC = 256;

static inline int64_t depth(const Gemm& g) { return g.k; }
using Panel = float;

#include "decode_f32.inc"
#include "sums512.inc"

template <int R>
static inline void micro(const Gemm& g, int64_t row, int64_t n0, const Panel* panel, int64_t begin, int64_t end,
                         bool first, bool last) {
  __m512 acc[R][2];
  load_sums<R, 2>(g, row, n0, first, last, acc);
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
  store_sums<R, 2>(g, row, n0, last, acc);
}

#include "tiling.inc"

}  // namespace avx512

const Kernel kernel_avx512 = {"avx512", avx512::NR, avx512::PAIR, avx512::MC, false, avx512::task, nullptr};

}  // namespace uform
