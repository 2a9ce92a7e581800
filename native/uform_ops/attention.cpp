// Multi-head attention over a fused qkv projection, float32, AVX2 with FMA (every machine the
// library's kernels run on has it): for each item b and head h,
//   out[b, i, h] = softmax_j(q_i . k_j / sqrt(D) + mask[b, i, j]) . v_j
// where row b * T + i of qkv holds [q | k | v], each [H][D]. One (b, h) is one task; scores
// live in a thread's scratch, so nothing of size T x T is allocated per call.
#pragma GCC target("avx2,fma")

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention.h"

namespace uform {
namespace {

// e^x for x in [-87, 88] (clamped outside): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its
// degree-6 Taylor polynomial (relative error below 2e-7), 2^n through the exponent field.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

struct Scratch {
  std::vector<float> kt, scores;  // k transposed [D][Tp]; one row of scores [Tp]
};

thread_local Scratch scratch;

}  // namespace

void attention_task(const Attention& a, int64_t task) {
  const int64_t b = task / a.heads, h = task % a.heads, t = a.tokens, d = a.head_dim;
  const int64_t width = a.heads * d, stride = 3 * width, tp = (t + 31) / 32 * 32;
  const float* rows = a.qkv + b * t * stride;
  Scratch& s = scratch;
  s.kt.assign(size_t(d * tp), 0.0f);
  s.scores.resize(size_t(tp));
  for (int64_t j = 0; j < t; ++j) {
    const float* k = rows + j * stride + width + h * d;
    for (int64_t c = 0; c < d; ++c) s.kt[size_t(c * tp + j)] = k[c];
  }
  const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(float(d)));
  for (int64_t i = 0; i < t; ++i) {
    const float* q = rows + i * stride + h * d;
    float* score = s.scores.data();
    for (int64_t j0 = 0; j0 < tp; j0 += 32) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t c = 0; c < d; ++c) {
        const __m256 qc = _mm256_broadcast_ss(q + c);
        const float* kt = s.kt.data() + c * tp + j0;
        for (int u = 0; u < 4; ++u) acc[u] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(kt + 8 * u), acc[u]);
      }
      for (int u = 0; u < 4; ++u) _mm256_storeu_ps(score + j0 + 8 * u, _mm256_mul_ps(acc[u], scale));
    }
    const float* mask = a.mask == nullptr ? nullptr : a.mask_per_query ? a.mask + i * t : a.mask + b * t;
    float top = -INFINITY;
    for (int64_t j = 0; j < t; ++j) {
      if (mask) score[j] += mask[j];
      top = std::max(top, score[j]);
    }
    const __m256 shift = _mm256_set1_ps(top);
    __m256 total8 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= t; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(score + j), shift));
      _mm256_storeu_ps(score + j, e);
      total8 = _mm256_add_ps(total8, e);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, total8);
    float total = lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
    if (j < t) {
      alignas(32) float tail[8] = {};
      for (int64_t u = j; u < t; ++u) tail[u - j] = score[u] - top;
      _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
      for (int64_t u = j; u < t; ++u) total += (score[u] = tail[u - j]);
    }
    const float inverse = 1.0f / total;
    float* out = a.out + (b * t + i) * width + h * d;
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
      const int64_t lanes_here = std::min<int64_t>(32, d - c0) / 8;  // d is a multiple of 8
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t u = 0; u < t; ++u) {
        const __m256 p = _mm256_broadcast_ss(score + u);
        const float* v = rows + u * stride + 2 * width + h * d + c0;
        for (int64_t l = 0; l < lanes_here; ++l) acc[l] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * l), acc[l]);
      }
      for (int64_t l = 0; l < lanes_here; ++l) _mm256_storeu_ps(out + c0 + 8 * l, _mm256_mul_ps(acc[l], _mm256_set1_ps(inverse)));
    }
  }
}

}  // namespace uform
