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

constexpr int64_t ROWS = 4, LANES = 16, BLOCK = 64;  // BLOCK: keys a block of scores (four vectors)
constexpr bool GATHER = false;  // values read in place (gathered: 0.83-1.03x, docs/notes/benchmarks-history.md)

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

// Scores of R rows (q: the first one's query) against the V * LANES keys of kt's columns,
// scaled, into scored's rows (both already at the block's first key).
template <int R, int V>
inline void score_block(const float* q, int64_t stride, int64_t d, const float* __restrict kt, int64_t tp, float* __restrict scored,
                        __m512 scale) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    __m512 k[V];
    for (int u = 0; u < V; ++u) k[u] = _mm512_loadu_ps(kt + c * tp + LANES * u);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(q[r * stride + c]);
      for (int u = 0; u < V; ++u) acc[r][u] = _mm512_fmadd_ps(x, k[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) _mm512_storeu_ps(scored + r * tp + LANES * u, _mm512_mul_ps(acc[r][u], scale));
}

// Scores of R rows against every key, block by block (attention.inc).
template <int R, class Scale>
void score_keys(const float* q, int64_t stride, int64_t d, const float* kts, int64_t tp, float* scored, Scale scale);

// Scores of rows [i, i + R) against every key (tp of them, padded to LANES), scaled and
// masked, then each row's softmax numerators (exp of score - max) in place; answers the
// rows' reciprocal sums.
template <int R>
void scores(const Attention& a, const float* __restrict rows, int64_t h, int64_t i, int64_t tp, const float* __restrict kts,
            float* __restrict scored, float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, stride = 3 * a.heads * d;
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(float(d)));
  const float* q = rows + i * stride + h * d;
  score_keys<R>(q, stride, d, kts, tp, scored, scale);
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
      float* out = a.out + (a.item * t + i + r) * width + h * d + c0;
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
