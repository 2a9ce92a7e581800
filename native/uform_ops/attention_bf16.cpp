// Attention for the avx512-bf16 variant: scores and softmax as attention.cpp computes them
// (float32, AVX-512 F; attention512.inc), the values as BF16 products (VDPBF16PS, float32 sums):
// each head's v rounded to BF16 (nearest even) and gathered into pairs of keys, each row's
// softmax numerators rounded to BF16 in place, so one VDPBF16PS takes two keys' products for 16
// columns where float32 FMA took one key's: the values pass at twice the rate. The rounding
// matches the tiles' (attention_tiles.inc: v and the numerators in BF16, errors of 2^-9 that
// average over the keys); q and k stay float32 here. A key's products are summed in pairs in
// key order whatever the padding (a padded key's numerator and value are zeros), so a row's bits
// do not depend on its batch.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace uform {
namespace {

constexpr int64_t ROWS = 4, LANES = 16, BLOCK = 64;  // BLOCK: keys a block of scores, and columns a pass of values
constexpr bool GATHER = true;  // v gathered as BF16 pairs of keys (below)

#include "attention512.inc"

// Head h's values rounded to BF16 and gathered into pairs of keys, [ceil(D / BLOCK)][ceil(T / 2)]
// [BLOCK][2] (the second of an odd T's last pair zero), in the room attention.inc gives the float32
// gather ([ceil(D / BLOCK)][T][BLOCK] floats: at least as many bytes).
#define UFORM_OWN_GATHER
void gather_values(const float* rows, int64_t stride, int64_t offset, int64_t t, int64_t d, float* __restrict room) {
  uint32_t* vs = reinterpret_cast<uint32_t*>(room);
  const int64_t pairs = (t + 1) / 2;
  for (int64_t c0 = 0; c0 < d; c0 += BLOCK) {
    const int64_t width = std::min<int64_t>(BLOCK, d - c0);  // a multiple of 16
    for (int64_t j = 0; j < pairs; ++j) {
      const float* even = rows + 2 * j * stride + offset + c0;
      const float* odd = 2 * j + 1 < t ? even + stride : nullptr;
      uint32_t* to = vs + (c0 / BLOCK * pairs + j) * BLOCK;
      for (int64_t c = 0; c < width; c += 16) {
        const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(even + c)));
        const __m512i hi = odd ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(odd + c))) : _mm512_setzero_si512();
        _mm512_storeu_si512(to + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
  }
}

// out[i + r] = (sum_j p[r][j] v_j) * inverse[r], 64 columns at a time: the rows' numerators
// (scored, float32, zeros past T up to tp) rounded to BF16 pairs in place first.
template <int R>
void values(const Attention& a, const float* __restrict, const float* room, int64_t h, int64_t i, int64_t tp, const float* scored,
            const float* inverse) {
  const int64_t t = a.tokens, d = a.head_dim, width = a.heads * d, pairs = (t + 1) / 2;
  float* numerators = const_cast<float*>(scored);  // this task's own scratch (attention.inc)
  for (int r = 0; r < R; ++r) {  // tp is a multiple of 16: 16 floats become 8 pairs, written behind the reads
    float* row = numerators + r * tp;
    uint16_t* bf16 = reinterpret_cast<uint16_t*>(row);
    for (int64_t j = 0; j < tp; j += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(bf16 + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + j)));
  }
  const uint32_t* vs = reinterpret_cast<const uint32_t*>(room);
  for (int64_t c0 = 0; c0 < d; c0 += BLOCK) {
    const int64_t vectors = std::min<int64_t>(BLOCK, d - c0) / LANES;
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    const uint32_t* block = vs + c0 / BLOCK * pairs * BLOCK;
    for (int64_t j = 0; j < pairs; ++j) {
      __m512bh vv[4];
      for (int u = 0; u < 4; ++u) vv[u] = u < vectors ? (__m512bh)_mm512_loadu_si512(block + j * BLOCK + 16 * u) : (__m512bh)_mm512_setzero_si512();
      for (int r = 0; r < R; ++r) {
        uint32_t word;
        std::memcpy(&word, numerators + r * tp + j, sizeof word);  // numerators 2j and 2j + 1, as BF16
        const __m512bh p = (__m512bh)_mm512_set1_epi32(int(word));
        for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], p, vv[u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (a.first_row + a.item * t + i + r) * width + h * d + c0;
      for (int u = 0; u < vectors; ++u) {
        const __m512 value = _mm512_mul_ps(acc[r][u], _mm512_set1_ps(inverse[r]));
        if (a.handed)  // to the next product's x, rounded as round_rows_avx512bf16 rounds it
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.handed + at + 16 * u), (__m256i)_mm512_cvtneps_pbh(value));
        else
          _mm512_storeu_ps(a.out + at + 16 * u, value);
      }
    }
  }
}

#include "attention.inc"

}  // namespace

void attention_tasks_bf16(const Attention& call, int64_t begin, int64_t end) {
  for (int64_t task = begin; task < end; ++task) run_task(call, task);
}

}  // namespace uform
