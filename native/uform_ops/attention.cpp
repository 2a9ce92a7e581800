// Multi-head attention over a fused qkv projection, float32, AVX-512 F: for each item b and
// head h,
//   out[b, i, h] = softmax_j(q_i . k_j / sqrt(D) + mask[b, i, j]) . v_j
// where row b * T + i of qkv holds [q | k | v], each [H][D]. One (b, h) is one task; its keys
// are transposed into a thread's scratch (8 x 8 at a time, in registers; T padded to 16), and
// four query rows go at a time, so each load of k or v feeds four FMAs (sixteen accumulators
// per block of 64 keys or 64 columns; the last block of keys only as many vectors as they
// fill). Scores live in the scratch too: nothing of size T x T is allocated per call. A
// key's score sums its D products in order whatever T is padded to: a row's bits do not
// depend on how many keys share its block. On the base towers
// (2 cores) this runs 1-6 % faster than ONNX Runtime's unfused MatMul/Softmax/MatMul; its
// AVX2 twin is attention_avx2.cpp (docs/op-library.md).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512dq,fma")

namespace uform {
namespace {

constexpr int64_t ROWS = 4, LANES = 16, BLOCK = 64;  // BLOCK: keys a block of scores (four vectors)
constexpr bool GATHER = false;  // values read in place (gathered: 0.83-1.03x, docs/notes/benchmarks-history.md)

#include "attention512.inc"

// out[i + r] = (sum_j p[r][j] v_j) * inverse[r], 64 columns at a time.
template <int R>
void values(const Attention& a, const float* __restrict rows, const float*, int64_t h, int64_t i, int64_t tp, const float* __restrict scored,
            const float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, width = a.heads * d, stride = 3 * width;
  for (int64_t c0 = 0; c0 < d; c0 += BLOCK) {
    const int64_t vectors = std::min<int64_t>(BLOCK, d - c0) / LANES;
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < t; ++j) {
      const float* v = rows + j * stride + 2 * width + h * d + c0;
      __m512 vv[4];
      for (int u = 0; u < 4; ++u) vv[u] = u < vectors ? _mm512_loadu_ps(v + 16 * u) : _mm512_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(scored[r * tp + j]);
        for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_fmadd_ps(p, vv[u], acc[r][u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* out = a.out + (a.first_row + a.item * t + i + r) * width + h * d + c0;
      for (int u = 0; u < vectors; ++u) _mm512_storeu_ps(out + 16 * u, _mm512_mul_ps(acc[r][u], _mm512_set1_ps(inverse[r])));
    }
  }
}

#include "attention.inc"

}  // namespace

void attention_tasks(const Attention& call, int64_t begin, int64_t end) {
  for (int64_t task = begin; task < end; ++task) run_task(call, task);
}

}  // namespace uform
