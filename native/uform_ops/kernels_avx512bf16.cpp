// AVX-512 BF16 (x86-64-v4+vnni+bf16 and above): products of BF16 pairs with float32
// accumulation (VDPBF16PS). Activations are rounded to BF16 once per product (round to
// nearest even); weights decode to BF16 exactly (E4M3 through a 256-entry table).
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace uform {
namespace avx512bf16 {

// 6 rows x 64 columns a micro-tile: 24 sums, and a step loads 4 vectors of weights and 6
// broadcasts for 24 products (12 x 32 took 2 loads and 12 broadcasts: about 5 % slower)
constexpr int V = 4, MRV = 6;
constexpr int64_t NR = 16 * V, MR = MRV, MC = 192, PAIR = 2, KC = 256;  // KC in pairs
using Panel = uint32_t;  // a BF16 pair: w[n, 2p] in the low half, w[n, 2p + 1] in the high

// BF16 weights are packed exactly as the micro-kernel reads them.
static const Panel* in_place(const Gemm& g, int64_t j) {
  return g.wtype == kBF16 ? static_cast<const Panel*>(g.w) + j * (g.kpad / 2) * NR : nullptr;
}

// E4M3 codes (packed like BF16 pairs, a byte each) to BF16: see decode_e4m3_bf16_avx512.
static void decode(const Gemm& g, int64_t j, Panel* out) {
  const int64_t count = g.kpad * NR;  // bytes of one panel
  decode_e4m3_bf16_avx512(static_cast<const uint8_t*>(g.w) + j * count, reinterpret_cast<uint16_t*>(out), count);
}

// Tasks row block by row block (tiling.inc), a block of x kept in L2 while the panels stream past
// it: BF16 panels read in place, E4M3 panels decoded once a thread into a slot each where they
// fit (all_panels_held). Panel by panel, x was read from memory again for every panel: the four
// base products, BF16 1.04x / 1.10x / 1.17x at 1,536 / 5,568 / 12,608 rows (64 images), E4M3
// 1.00x / 1.07x / 1.20x (Zen 5, two threads).
static bool all_panels_held(const Gemm& g, int64_t blocks);
static inline bool rows_outer(const Gemm& g, int64_t blocks) { return g.wtype == kBF16 || all_panels_held(g, blocks); }

static inline int64_t depth(const Gemm& g) { return g.kpad / 2; }

#define UFORM_HANDS_BF16
#include "sums512.inc"
#undef UFORM_HANDS_BF16

template <int R>
static inline void micro(const Gemm& g, int64_t row, int64_t n0, const Panel* panel, int64_t begin, int64_t end,
                         bool first, bool last, float* held) {
  __m512 acc[R][V];
  load_sums<R, V>(g, row, n0, first, last, acc, held);
  const int32_t* x = reinterpret_cast<const int32_t*>(g.xb + row * g.kpad);
  const int64_t stride = g.kpad / 2;
  for (int64_t p = begin; p < end; ++p) {
    __m512bh b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(panel + p * NR + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(x[r * stride + p]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  store_sums<R, V>(g, row, n0, last, acc, held);
}

#include "tiling.inc"

}  // namespace avx512bf16

// E4M3 codes to BF16, 32 at a time: a normal code's exponent and mantissa move into BF16's
// fields and rebias by 120; the 8 subnormal magnitudes (m * 2^-9) come from a table, looked up
// into the lanes that need them; the sign goes to bit 15 in the same step as the OR (VPTERNLOG).
// Nine operations a vector where a separate blend and sign mask made eleven: 1.07-1.09x over
// panels in cache (Zen 5), though a 12-byte E4M3 query's latency moved within its noise (8.3 ms).
void decode_e4m3_bf16_avx512(const uint8_t* src, uint16_t* dst, int64_t count) {
  alignas(64) uint16_t small[32] = {};
  for (int m = 0; m < 8; ++m) small[m] = e4m3_to_bf16[m];
  const __m512i table = _mm512_load_si512(small);
  const __m512i low7 = _mm512_set1_epi16(0x7F), bias = _mm512_set1_epi16(0x3C00), eight = _mm512_set1_epi16(8);
  const __m512i signbit = _mm512_set1_epi16(int16_t(0x8000));
  for (int64_t i = 0; i < count; i += 32) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m512i magnitude = _mm512_and_si512(v, low7);
    const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(magnitude, 4), bias);
    const __mmask32 subnormal = _mm512_cmplt_epu16_mask(magnitude, eight);
    const __m512i value = _mm512_mask_permutexvar_epi16(normal, subnormal, magnitude, table);
    // value | (v << 8 & 0x8000): VPTERNLOG's table for a | (b & c) is 0xF8
    _mm512_storeu_si512(dst + i, _mm512_ternarylogic_epi32(value, _mm512_slli_epi16(v, 8), signbit, 0xF8));
  }
}

// Rows [begin, end) of x rounded to BF16 (to nearest even), zeros from k to kpad.
void round_rows_avx512bf16(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t begin, int64_t end) {
  using avx512bf16::lanes;
  for (int64_t r = begin; r < end; ++r) {
    const float* src = x + r * k;
    uint16_t* dst = xb + r * kpad;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
      _mm512_storeu_si512(dst + i, (__m512i)v);
    }
    for (; i < k; i += 16) {
      const __mmask16 m = lanes(k - i);
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
      _mm256_mask_storeu_epi16(dst + i, m, (__m256i)v);
    }
    std::memset(dst + k, 0, size_t(kpad - k) * sizeof(uint16_t));
  }
}

const Kernel kernel_avx512bf16 = {"avx512-bf16", avx512bf16::NR, avx512bf16::PAIR, avx512bf16::MC, true, avx512bf16::task,
                                  round_rows_avx512bf16};

}  // namespace uform
