// attention.cpp's multi-head attention at 256 bits (AVX2 with FMA): the same tasks, scratch
// and order of work, at 8 lanes. Keys go in blocks of 32 (four vectors; the last block only
// as many vectors as the keys fill, T padded to 8) against three query rows at a time (twelve
// sums), so each load of k or v still feeds three FMAs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention.h"

// Only after every include (attention.cpp says why).
#pragma GCC target("avx2,fma")

namespace uform {
namespace {

constexpr int64_t ROWS = 3, LANES = 8, BLOCK = 32;  // BLOCK: keys a block of scores (four vectors), columns a pass of values
constexpr bool GATHER = true;  // values gathered (gather_values; 1.06-1.18x from 53 keys)

// e^x for x in [-87, 88] (clamped outside): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its
// degree-6 Taylor polynomial (relative error below 2e-7), times 2^n built in the exponent bits.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);  // n in [-126, 127]
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float max8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// Scores of R rows (q: the first one's query) against the V * LANES keys of kt's columns,
// scaled, into scored's rows (both already at the block's first key).
template <int R, int V>
inline void score_block(const float* q, int64_t stride, int64_t d, const float* __restrict kt, int64_t tp, float* __restrict scored,
                        __m256 scale) {
  __m256 acc[R][V];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u) acc[r][u] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    __m256 k[V];
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u) k[u] = _mm256_loadu_ps(kt + c * tp + LANES * u);
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(q + r * stride + c);
#pragma GCC unroll 4
      for (int u = 0; u < V; ++u) acc[r][u] = _mm256_fmadd_ps(x, k[u], acc[r][u]);
    }
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < V; ++u) _mm256_storeu_ps(scored + r * tp + LANES * u, _mm256_mul_ps(acc[r][u], scale));
}

// Scores of R rows against every key, block by block (attention.inc).
template <int R, class Scale>
void score_keys(const float* q, int64_t stride, int64_t d, const float* kts, int64_t tp, float* scored, Scale scale);

// Scores of rows [i, i + R) against every key (tp of them, padded to LANES), scaled and
// masked (keys past the last, -inf), then each row's softmax numerators in place; answers
// the rows' reciprocal sums.
template <int R>
void scores(const Attention& a, const float* __restrict rows, int64_t h, int64_t i, int64_t tp, const float* __restrict kts,
            float* __restrict scored, float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, stride = 3 * a.heads * d;
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(float(d)));
  const float* q = rows + i * stride + h * d;
  score_keys<R>(q, stride, d, kts, tp, scored, scale);
  for (int r = 0; r < R; ++r) {
    float* row = scored + r * tp;
    const float* mask = a.mask == nullptr ? nullptr : a.mask_per_query ? a.mask + (i + r) * t : a.mask + a.item * t;
    if (mask)
      for (int64_t j = 0; j < t; ++j) row[j] += mask[j];
    std::fill(row + t, row + tp, -INFINITY);
    __m256 top = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < tp; j += LANES) top = _mm256_max_ps(top, _mm256_loadu_ps(row + j));
    const __m256 shift = _mm256_set1_ps(max8(top));
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < tp; j += LANES) {
      // exp(-inf - shift) would clamp to e^-87, not 0: keys past the last are zeroed
      const __m256 v = _mm256_loadu_ps(row + j);
      const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(v, shift)), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
      _mm256_storeu_ps(row + j, e);
      total = _mm256_add_ps(total, e);
    }
    inverse[r] = 1.0f / sum8(total);
  }
}

// out[i + r] = (sum_j p[r][j] v_j) * inverse[r], 32 columns at a time.
template <int R>
void values(const Attention& a, const float*, const float* __restrict vs, int64_t h, int64_t i, int64_t tp, const float* __restrict scored,
            const float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, width = a.heads * d;
  for (int64_t c0 = 0; c0 < d; c0 += BLOCK) {
    const int64_t vectors = std::min<int64_t>(BLOCK, d - c0) / LANES;
    __m256 acc[R][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < t; ++j) {
      const float* v = vs + c0 * t + j * BLOCK;  // block c0 / BLOCK of the gathered values, [T][BLOCK]
      __m256 vv[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) vv[u] = u < vectors ? _mm256_loadu_ps(v + LANES * u) : _mm256_setzero_ps();
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r) {
        const __m256 p = _mm256_broadcast_ss(scored + r * tp + j);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[r][u] = _mm256_fmadd_ps(p, vv[u], acc[r][u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* out = a.out + (a.first_row + a.item * t + i + r) * width + h * d + c0;
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u)  // constant indices: the sums stay in registers
        if (u < vectors) _mm256_storeu_ps(out + LANES * u, _mm256_mul_ps(acc[r][u], _mm256_set1_ps(inverse[r])));
    }
  }
}

#include "attention.inc"

}  // namespace

void attention_tasks_avx2(const Attention& call, int64_t begin, int64_t end) {
  for (int64_t task = begin; task < end; ++task) run_task(call, task);
}

}  // namespace uform
