// AVX2 with FMA (x86-64-v3): float32 FMA over weights widened to float32 in the decoded panel.
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

namespace uform {
namespace avx2 {

constexpr int64_t NR = 16, MR = 6, MC = 192, PAIR = 1, KC = 256;

static inline int64_t depth(const Gemm& g) { return g.k; }
using Panel = float;

#include "decode_f32.inc"

template <int R>
static inline void micro(const Gemm& g, int64_t row, int64_t n0, const Panel* panel, int64_t begin, int64_t end,
                         bool first, bool last) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  alignas(32) float s[NR], c[NR], out[NR];
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (first) {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    } else {
      std::memset(out, 0, sizeof out);
      std::memcpy(out, g.y + (row + r) * g.n + n0, size_t(cols) * 4);
      acc[r][0] = _mm256_load_ps(out);
      acc[r][1] = _mm256_load_ps(out + 8);
    }
  }
  const float* x = g.x + row * g.k;
  for (int64_t i = begin; i < end; ++i) {
    const __m256 b0 = _mm256_load_ps(panel + i * NR);
    const __m256 b1 = _mm256_load_ps(panel + i * NR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * g.k + i);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int64_t j = 0; j < NR; ++j) {
    s[j] = last && g.scale && j < cols ? g.scale[n0 + j] : 1.0f;
    c[j] = last && g.bias && j < cols ? g.bias[n0 + j] : 0.0f;
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

// The largest magnitude's bits among k BF16 values (BF16 magnitudes order as integers; a
// result of 0x7F80 or more means a NaN or an infinity is among them).
uint16_t max_magnitude_avx2(const uint16_t* row, int64_t k) {
  __m256i top = _mm256_setzero_si256();
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    top = _mm256_max_epu16(top, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i)), magnitude));
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  uint16_t best = 0;
  for (uint16_t v : lanes) best = std::max(best, v);
  for (; i < k; ++i) best = std::max<uint16_t>(best, row[i] & 0x7FFFu);
  return best;
}

// E4M3 codes of row[i] * inverse (BF16 weights), 8 at a time; the same bits as the scalar
// encode_e4m3 (round to nearest even, saturating at 448) for the tail.
void encode_e4m3_avx2(const uint16_t* row, int64_t k, float inverse, uint8_t* codes) {
  const __m256 scale = _mm256_set1_ps(inverse), tiny = _mm256_set1_ps(0.015625f), one = _mm256_set1_ps(1.0f);
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), half = _mm256_set1_epi32(0x7FFFF);
  const __m256i rebias = _mm256_set1_epi32(120 << 3), top = _mm256_set1_epi32(0x7E);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i))), 16);
    const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(wide), scale));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    const __m256i abs = _mm256_and_si256(bits, magnitude);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(abs, 20), _mm256_set1_epi32(1));
    const __m256i field = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(abs, half), odd), 20);
    const __m256i normal = _mm256_min_epu32(_mm256_sub_epi32(_mm256_max_epu32(field, rebias), rebias), top);
    const __m256 a = _mm256_castsi256_ps(abs);
    const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_min_ps(a, one), _mm256_set1_ps(512.0f)));
    const __m256i code = _mm256_or_si256(
        _mm256_blendv_epi8(normal, subnormal, _mm256_castps_si256(_mm256_cmp_ps(a, tiny, _CMP_LT_OQ))), sign);
    const __m256i narrow = _mm256_packus_epi16(_mm256_packus_epi32(code, code), _mm256_setzero_si256());
    const uint32_t low = uint32_t(_mm_cvtsi128_si32(_mm256_castsi256_si128(narrow)));
    const uint32_t high = uint32_t(_mm_cvtsi128_si32(_mm256_extracti128_si256(narrow, 1)));
    std::memcpy(codes + i, &low, 4);
    std::memcpy(codes + i + 4, &high, 4);
  }
  for (; i < k; ++i) {
    const uint32_t bits = uint32_t(row[i]) << 16;
    float w;
    std::memcpy(&w, &bits, 4);
    codes[i] = encode_e4m3(w * inverse);
  }
}

const Kernel kernel_avx2 = {"avx2", avx2::NR, avx2::PAIR, avx2::MC, false, avx2::task, nullptr};

}  // namespace uform
