// Multi-head attention over a fused qkv projection, float32, AVX-512 F: for each item b and
// head h,
//   out[b, i, h] = softmax_j(q_i . k_j / sqrt(D) + mask[b, i, j]) . v_j
// where row b * T + i of qkv holds [q | k | v], each [H][D]. One (b, h) is one task; its keys
// are transposed into a thread's scratch, and four query rows go at a time, so each load of
// k or v feeds four FMAs (sixteen accumulators per block of 64 keys or 64 columns). Scores
// live in the scratch too: nothing of size T x T is allocated per call. On the base towers
// (2 cores) this runs 1-6 % faster than ONNX Runtime's unfused MatMul/Softmax/MatMul; its
// AVX2 twin is attention_avx2.cpp (docs/backends.md).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512dq,fma")

namespace uform {
namespace {

constexpr int64_t ROWS = 4, LANES = 16, BLOCK = 64;

// e^x for x in [-87, 88] (clamped outside): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its
// degree-6 Taylor polynomial (relative error below 2e-7), times 2^n (scalef).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// Scores of rows [i, i + rows) against every key, scaled and masked, then each row's softmax
// numerators (exp of score - max) in place; answers the rows' reciprocal sums.
template <int R>
void scores(const Attention& a, const float* __restrict rows, int64_t h, int64_t i, int64_t tp, const float* __restrict kts,
            float* __restrict scored, float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, stride = 3 * a.heads * d;
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(float(d)));
  for (int64_t j0 = 0; j0 < tp; j0 += BLOCK) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
      const float* kt = kts + c * tp + j0;
      const __m512 k0 = _mm512_loadu_ps(kt), k1 = _mm512_loadu_ps(kt + 16), k2 = _mm512_loadu_ps(kt + 32), k3 = _mm512_loadu_ps(kt + 48);
      for (int r = 0; r < R; ++r) {
        const __m512 q = _mm512_set1_ps(rows[(i + r) * stride + h * d + c]);
        acc[r][0] = _mm512_fmadd_ps(q, k0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(q, k1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(q, k2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(q, k3, acc[r][3]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(scored + r * tp + j0 + 16 * u, _mm512_mul_ps(acc[r][u], scale));
  }
  for (int r = 0; r < R; ++r) {
    float* row = scored + r * tp;
    const float* mask = a.mask == nullptr ? nullptr : a.mask_per_query ? a.mask + (i + r) * t : a.mask + a.item * t;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < tp; j += LANES) {
      const __mmask16 valid = j + LANES <= t ? __mmask16(0xFFFF) : j < t ? __mmask16((1u << (t - j)) - 1) : __mmask16(0);
      __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, row + j);
      if (mask) v = _mm512_add_ps(v, _mm512_mask_loadu_ps(_mm512_setzero_ps(), valid, mask + j));
      _mm512_storeu_ps(row + j, v);
      top = _mm512_max_ps(top, v);
    }
    const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < tp; j += LANES) {
      const __mmask16 valid = j + LANES <= t ? __mmask16(0xFFFF) : j < t ? __mmask16((1u << (t - j)) - 1) : __mmask16(0);
      const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift)));
      _mm512_storeu_ps(row + j, e);
      total = _mm512_add_ps(total, e);
    }
    inverse[r] = 1.0f / _mm512_reduce_add_ps(total);
  }
}

// out[i + r] = (sum_j p[r][j] v_j) * inverse[r], 64 columns at a time.
template <int R>
void values(const Attention& a, const float* __restrict rows, int64_t h, int64_t i, int64_t tp, const float* __restrict scored,
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
      float* out = a.out + (a.item * t + i + r) * width + h * d + c0;
      for (int u = 0; u < vectors; ++u) _mm512_storeu_ps(out + 16 * u, _mm512_mul_ps(acc[r][u], _mm512_set1_ps(inverse[r])));
    }
  }
}

template <int R>
void block(const Attention& a, const float* rows, int64_t h, int64_t i, int64_t tp, const float* kt, float* scored) {
  float inverse[ROWS];
  scores<R>(a, rows, h, i, tp, kt, scored, inverse);
  values<R>(a, rows, h, i, tp, scored, inverse);
}

#include "attention.inc"

}  // namespace

void attention_task(const Attention& call, int64_t task) { run_task(call, task); }

}  // namespace uform
