// AVX2 with FMA (x86-64-v3): float32 FMA over BF16 or E4M3 weights, widened as they are read.
//
// Weights are packed in pairs, [k / 2][16][2] per panel of 16 columns (as the BF16
// dot-product variant packs them), so that widening costs one instruction per 8 weights
// after the load: a BF16 pair is one 32-bit word whose even weight widens by a shift left of
// 16 and whose odd one by masking the high half; an E4M3 pair is one 16-bit word whose codes
// become the F16 bits of code * 2^-8 exactly (subnormals and zeros included) by moving the
// code to the high byte, an arithmetic shift right by 1 and a mask, then vcvtph2ps; the 2^8
// is applied with the scale.
//
// Up to 96 rows a product is cut into spans of panels, one for each thread, whose panels the
// threads take one at a time, a thread's own first and then the others' (PanelSpans, gemm.h),
// so that none waits while another has panels left; larger products into tasks of up to 96 rows
// (the blocks as even as can be) times up to 4 panels, in the order of their rows. Each group
// of up to 6 rows reads a panel over all of k and sums in registers, y written once. The first group reads the panel from DRAM or L3 (fetched
// REACH bytes ahead, and the next panel into L2 behind it), the others from L1 or L2: what
// moves from DRAM is the packed weights, and x once.
// - BF16 widens in registers at every m (a shift or a mask per 8 weights, on ports the FMAs
//   leave free: six rows ran at the FMA peak).
// - E4M3 widens in registers up to 3 rows. From 4 its panel is staged: the codes turned into
//   F16 bits once, into L1 or L2, which every group then converts from memory as it sums. A
//   conversion from memory costs the FMA pipes next to nothing; in registers, five integer
//   operations, two extracts and four conversions a pair made a step of six rows take 1.34x
//   the FMAs' time, for every group again. Staging a panel alone is bound by its stores (64
//   bytes a pair) while the FMA pipes wait, so only a thread's first panel of a product (of a
//   task, past 96 rows) is: the first group of rows stages the next panel as it reads this
//   one, its stores beside the FMAs.
//
// Where 256-bit operations run as two 128-bit halves (AMD Zen 1 and Zen+: `splits_256`),
// the widening's integer operations and conversions take slots of the two FMA pipes, so the
// `avx2-split` variant stages a panel as float32 instead (`stage_f32`, into L1 or L2), the
// loop then only loading weights as an FP32 GEMM does: BF16 from 25 rows (five groups; below,
// its shift and mask cost less than the staging), E4M3 from 7 (two groups). Same bits: every
// weight widens exactly and the sums run in the same order.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx2,fma,f16c")

namespace uform {
namespace avx2 {

typedef int32_t Int8x32 __attribute__((vector_size(32), may_alias));
#define UFORM_VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#include "gelu.inc"
#undef UFORM_VFMA

constexpr int64_t NR = 16, MR = 6, PAIR = 2;
constexpr int STAGED = 2;            // `widened`'s weights: E4M3 panels staged as F16 bits (beside kBF16, kE4M3)
constexpr int WIDE = 3;              // `widened`'s weights: panels staged as float32 (avx2-split)
constexpr int STAGING = 4;           // `widened`'s weights: STAGED, the group also staging the task's next panel
constexpr int64_t WIDE_BF16_FROM = 25;  // avx2-split: rows from which BF16 panels are staged as float32
constexpr int64_t WIDE_E4M3_FROM = 7;   // avx2-split: rows from which E4M3 panels are staged as float32
constexpr int64_t STAGE_FROM = 4;    // rows from which E4M3 panels are staged (staged at 1-3 rows: 0.48-0.56x BF16, in registers 0.89-1.02x)
constexpr int64_t MC = 96;           // rows per task at most
constexpr int64_t REACH = 2048;      // bytes ahead that weights widened in registers are fetched from DRAM (4 and 8 KiB: the same)

static inline __m256i lanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::clamp<int64_t>(count, 0, 8))), index);
}

// y for rows [row, row + R) and the panel's columns from n0: act(scale * sum + bias) +
// residual (E4M3's widened weights are code * 2^-8: the 2^8 comes here).
template <int R>
static inline void finish(const Gemm& g, int64_t row, int64_t n0, const __m256 (*acc)[2]) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  const __m256i m0 = lanes(cols), m1 = lanes(cols - 8);
  const __m256 unit = _mm256_set1_ps(g.wtype == kE4M3 ? 256.0f : 1.0f);
  const __m256 s0 = g.scale ? _mm256_mul_ps(unit, _mm256_maskload_ps(g.scale + n0, m0)) : unit;
  const __m256 s1 = g.scale ? _mm256_mul_ps(unit, _mm256_maskload_ps(g.scale + n0 + 8, m1)) : unit;
  const __m256 c0 = g.bias ? _mm256_maskload_ps(g.bias + n0, m0) : _mm256_setzero_ps();
  const __m256 c1 = g.bias ? _mm256_maskload_ps(g.bias + n0 + 8, m1) : _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* y = g.y + (row + r) * g.n + n0;
    __m256 v0 = _mm256_fmadd_ps(acc[r][0], s0, c0);
    __m256 v1 = _mm256_fmadd_ps(acc[r][1], s1, c1);
    if (g.activation != kIdentity) {
      v0 = activate<__m256, Int8x32>(v0, g.activation);
      v1 = activate<__m256, Int8x32>(v1, g.activation);
    }
    if (g.residual) {
      const float* add = g.residual + (row + r) * g.n + n0;
      v0 = _mm256_add_ps(v0, _mm256_maskload_ps(add, m0));
      v1 = _mm256_add_ps(v1, _mm256_maskload_ps(add + 8, m1));
    }
    if (cols == NR) {
      _mm256_storeu_ps(y, v0);
      _mm256_storeu_ps(y + 8, v1);
    } else {
      _mm256_maskstore_ps(y, m0, v0);
      _mm256_maskstore_ps(y + 8, m1, v1);
    }
  }
}

// How a pair of k (even and odd) becomes float32, columns 0-7 and 8-15: a BF16 pair's word
// widens by a shift left of 16 (even k) and a mask of its high half (odd k); an E4M3 pair's by
// the F16 trick and vcvtph2ps; a staged pair's F16 bits (`stage`) by vcvtph2ps alone.
struct Widen {
  // even and odd k of pair p as float32, columns 0-7 and 8-15
  static inline void bf16(const void* w, int64_t p, __m256& e0, __m256& e1, __m256& o0, __m256& o1) {
    const uint32_t* at = static_cast<const uint32_t*>(w) + p * NR;
    const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 8));
    e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
    e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
    o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, high));
    o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, high));
  }
  static inline void e4m3(const void* w, int64_t p, __m256& e0, __m256& e1, __m256& o0, __m256& o1) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + p * NR));
    const __m256i keep = _mm256_set1_epi16(int16_t(0xBF80u));
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), keep);
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(v, 1), keep);
    e0 = _mm256_cvtph_ps(_mm256_castsi256_si128(even));
    e1 = _mm256_cvtph_ps(_mm256_extracti128_si256(even, 1));
    o0 = _mm256_cvtph_ps(_mm256_castsi256_si128(odd));
    o1 = _mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1));
  }
};

// E4M3 pairs [p0, pairs) of the panel at `at` as F16 bits, [k / 2][even 16, odd 16] of 16-bit
// words: the trick of `Widen::e4m3` done once for every group of rows that reads the panel.
static void stage_pairs(const char* at, int64_t p0, int64_t pairs, uint16_t* out) {
  const __m256i keep = _mm256_set1_epi16(int16_t(0xBF80u));
  at += p0 * NR * 2;
  out += p0 * 2 * NR;
  for (int64_t p = p0; p < pairs; ++p, at += NR * 2, out += 2 * NR) {
    _mm_prefetch(at + REACH, _MM_HINT_T0);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), keep));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + NR), _mm256_and_si256(_mm256_srai_epi16(v, 1), keep));
  }
}

static void stage(const Gemm& g, int64_t j, uint16_t* out) {
  const int64_t pairs = (g.k + 1) / 2;
  stage_pairs(static_cast<const char*>(g.w) + j * pairs * NR * 2, 0, pairs, out);
}

// Panel j's weights as float32, [k / 2][even 16, odd 16] floats: each pair widened as
// `Widen` does in registers, once for every group of rows that reads the panel.
static void stage_f32(const Gemm& g, int64_t j, float* out) {
  const int64_t pairs = (g.k + 1) / 2, word = g.wtype == kBF16 ? 4 : 2;
  const char* at = static_cast<const char*>(g.w) + j * pairs * NR * word;
  for (int64_t p = 0; p < pairs; ++p, at += NR * word, out += 2 * NR) {
    _mm_prefetch(at + REACH, _MM_HINT_T0);
    __m256 e0, e1, o0, o1;
    if (g.wtype == kBF16) {
      Widen::bf16(at, 0, e0, e1, o0, o1);
    } else {
      Widen::e4m3(at, 0, e0, e1, o0, o1);
    }
    _mm256_store_ps(out, e0);
    _mm256_store_ps(out + 8, e1);
    _mm256_store_ps(out + 16, o0);
    _mm256_store_ps(out + 24, o1);
  }
}

static inline void wide(const void* w, int64_t p, __m256& e0, __m256& e1, __m256& o0, __m256& o1) {
  const float* at = static_cast<const float*>(w) + p * 2 * NR;
  e0 = _mm256_load_ps(at);
  e1 = _mm256_load_ps(at + 8);
  o0 = _mm256_load_ps(at + 16);
  o1 = _mm256_load_ps(at + 24);
}

static inline void staged(const void* w, int64_t p, __m256& e0, __m256& e1, __m256& o0, __m256& o1) {
  const __m128i* at = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + p * 2 * NR);
  e0 = _mm256_cvtph_ps(_mm_load_si128(at));
  e1 = _mm256_cvtph_ps(_mm_load_si128(at + 1));
  o0 = _mm256_cvtph_ps(_mm_load_si128(at + 2));
  o1 = _mm256_cvtph_ps(_mm_load_si128(at + 3));
}

// Rows [row, row + R) times the 16 columns of panel `w` over all of k (WT: kBF16 or kE4M3
// packed pairs, widened in registers, STAGED F16 bits or WIDE float32): the sums stay in registers from
// the first k to the last and y is written once. `next`: bytes from the panel to what is
// fetched into L2 as it is read (0: the panel itself, in cache already). STAGING reads F16 bits
// as STAGED does and stages the packed panel `src` into `dst` pair by pair as it goes.
template <int R, int WT>
__attribute__((noinline)) static void widened(const Gemm& g, int64_t row, int64_t n0, const void* w, int64_t next,
                                              const char* src = nullptr, uint16_t* dst = nullptr) {
  constexpr int64_t word = WT == kE4M3 ? 2 : WT == WIDE ? 8 : 4;  // bytes of a column's pair: two E4M3 codes, two BF16 weights, two staged F16 ones or float32
  alignas(32) __m256 acc[MR][2];                  // R of them used; the assembly writes six
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  if (g.residual) {  // read at the end: fetched now, while the sums run (rows n floats apart, no stream to detect)
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float* add = g.residual + (row + r) * g.n + n0;
      _mm_prefetch(reinterpret_cast<const char*>(add), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(add + NR - 1), _MM_HINT_T0);
    }
  }
  const float* x = g.x + row * g.k;
  const int64_t k = g.k, full = k / 2;
  int64_t p = 0;
  int64_t staged_to = 0;  // STAGING: pairs of the next panel staged so far
  if constexpr (WT == STAGING && R < 4) {
    stage_pairs(src, 0, (k + 1) / 2, dst);
    staged_to = (k + 1) / 2;
  }
  if constexpr (R >= 4) {
    // in assembly from four rows up: twelve sums (or eight, ten), the panel's two
    // vectors, one broadcast, one more. From intrinsics GCC spilled sums: five rows ran at
    // 57 % of the FMA peak against six rows' 100 % (weights in cache, one thread)
    if (full > 0) {
      const float* lo = x;
      const float* hi = x + 3 * k;
      const int64_t stride = k * int64_t(sizeof(float));
      int64_t n = full;
      const char* b = static_cast<const char*>(w);
      const char* c = src;
      uint16_t* d = dst;
      const __m256i mask = WT == kBF16 ? _mm256_set1_epi32(int32_t(0xFFFF0000u)) : _mm256_set1_epi16(int16_t(0xBF80u));
#define UFORM_ROW(u, at, s0, s1)                                                               \
  "vbroadcastss " #u at ", %%ymm14\n\t"                                                         \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm" #s0 "\n\tvfmadd231ps %%ymm13, %%ymm14, %%ymm" #s1 "\n\t"
#define UFORM_HALF4(u)                                                                          \
  UFORM_ROW(u, "(%[lo])", 0, 1) UFORM_ROW(u, "(%[lo],%[s],1)", 2, 3) UFORM_ROW(u, "(%[lo],%[s],2)", 4, 5) \
  UFORM_ROW(u, "(%[hi])", 6, 7)
#define UFORM_HALF5(u) UFORM_HALF4(u) UFORM_ROW(u, "(%[hi],%[s],1)", 8, 9)
#define UFORM_HALF6(u) UFORM_HALF5(u) UFORM_ROW(u, "(%[hi],%[s],2)", 10, 11)
// BF16: ymm15 holds the mask, the panel is read twice (the odd half's mask takes it from memory)
#define UFORM_BF16_EVEN "vmovdqu (%[b]), %%ymm12\n\tvmovdqu 32(%[b]), %%ymm13\n\tvpslld $16, %%ymm12, %%ymm12\n\tvpslld $16, %%ymm13, %%ymm13\n\t"
#define UFORM_BF16_ODD "vpand (%[b]), %%ymm15, %%ymm12\n\tvpand 32(%[b]), %%ymm15, %%ymm13\n\t"
// E4M3: ymm15 holds the pairs (the mask comes from memory), ymm14 the even F16 bits until
// they are widened
#define UFORM_E4M3_EVEN                                                                         \
  "vmovdqu (%[b]), %%ymm15\n\tvpsllw $8, %%ymm15, %%ymm14\n\tvpsraw $1, %%ymm14, %%ymm14\n\t"    \
  "vpand %[mask], %%ymm14, %%ymm14\n\tvcvtph2ps %%xmm14, %%ymm12\n\tvextracti128 $1, %%ymm14, %%xmm13\n\t" \
  "vcvtph2ps %%xmm13, %%ymm13\n\t"
#define UFORM_E4M3_ODD                                                                          \
  "vpsraw $1, %%ymm15, %%ymm15\n\tvpand %[mask], %%ymm15, %%ymm15\n\tvcvtph2ps %%xmm15, %%ymm12\n\t" \
  "vextracti128 $1, %%ymm15, %%xmm13\n\tvcvtph2ps %%xmm13, %%ymm13\n\t"
// staged E4M3: the F16 bits, converted from memory
#define UFORM_F16_EVEN "vcvtph2ps (%[b]), %%ymm12\n\tvcvtph2ps 16(%[b]), %%ymm13\n\t"
#define UFORM_F16_ODD "vcvtph2ps 32(%[b]), %%ymm12\n\tvcvtph2ps 48(%[b]), %%ymm13\n\t"
// staged E4M3 that stages the next panel's pair too (ymm15 and ymm14 free before the broadcasts)
#define UFORM_STAGE_NEXT                                                                        \
  "vmovdqu (%[c]), %%ymm15\n\tvpsllw $8, %%ymm15, %%ymm14\n\tvpsraw $1, %%ymm14, %%ymm14\n\t"    \
  "vpand %[mask], %%ymm14, %%ymm14\n\tvmovdqa %%ymm14, (%[d])\n\tvpsraw $1, %%ymm15, %%ymm15\n\t" \
  "vpand %[mask], %%ymm15, %%ymm15\n\tvmovdqa %%ymm15, 32(%[d])\n\tadd $32, %[c]\n\tadd $64, %[d]\n\t"
#define UFORM_F16S_EVEN UFORM_STAGE_NEXT UFORM_F16_EVEN
// staged float32: loads alone
#define UFORM_F32_EVEN "vmovaps (%[b]), %%ymm12\n\tvmovaps 32(%[b]), %%ymm13\n\t"
#define UFORM_F32_ODD "vmovaps 64(%[b]), %%ymm12\n\tvmovaps 96(%[b]), %%ymm13\n\t"
// the next panel, fetched into L2 at the rate this one is read (by the first group only)
#define UFORM_PFN "prefetcht1 (%[b],%[next],1)\n\t"
#define UFORM_WIDEN(HALF, SETUP, EVEN, ODD, STEP) UFORM_WIDEN_PF(HALF, SETUP, EVEN, ODD, STEP, "prefetcht0 %c[reach](%[b])\n\t" UFORM_PFN)
#define UFORM_WIDEN_PF(HALF, SETUP, EVEN, ODD, STEP, PF)                                               \
  __asm__ volatile(                                                                             \
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\tvxorps %%ymm1, %%ymm1, %%ymm1\n\tvxorps %%ymm2, %%ymm2, %%ymm2\n\t" \
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\tvxorps %%ymm4, %%ymm4, %%ymm4\n\tvxorps %%ymm5, %%ymm5, %%ymm5\n\t" \
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\tvxorps %%ymm8, %%ymm8, %%ymm8\n\t" \
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\tvxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t" \
      SETUP                                                                                     \
      ".p2align 5\n\t"                                                                          \
      "1:\n\t"                                                                                  \
      EVEN HALF(0) ODD HALF(4)                                                                  \
      PF                                                                                        \
      "add $" #STEP ", %[b]\n\t"                                                                \
      "add $8, %[lo]\n\t"                                                                       \
      "add $8, %[hi]\n\t"                                                                       \
      "dec %[n]\n\t"                                                                            \
      "jnz 1b\n\t"                                                                              \
      "vmovaps %%ymm0, 0(%[acc])\n\tvmovaps %%ymm1, 32(%[acc])\n\tvmovaps %%ymm2, 64(%[acc])\n\t" \
      "vmovaps %%ymm3, 96(%[acc])\n\tvmovaps %%ymm4, 128(%[acc])\n\tvmovaps %%ymm5, 160(%[acc])\n\t" \
      "vmovaps %%ymm6, 192(%[acc])\n\tvmovaps %%ymm7, 224(%[acc])\n\tvmovaps %%ymm8, 256(%[acc])\n\t" \
      "vmovaps %%ymm9, 288(%[acc])\n\tvmovaps %%ymm10, 320(%[acc])\n\tvmovaps %%ymm11, 352(%[acc])\n\t" \
      : [b] "+r"(b), [lo] "+r"(lo), [hi] "+r"(hi), [n] "+r"(n), [c] "+r"(c), [d] "+r"(d)        \
      : [s] "r"(stride), [acc] "r"(&acc[0][0]), [mask] "m"(mask), [reach] "i"(REACH), [next] "r"(next) \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
        "xmm13", "xmm14", "xmm15", "cc", "memory")
#define UFORM_BF16(HALF) UFORM_WIDEN(HALF, "vmovdqa %[mask], %%ymm15\n\t", UFORM_BF16_EVEN, UFORM_BF16_ODD, 64)
#define UFORM_E4M3(HALF) UFORM_WIDEN(HALF, "", UFORM_E4M3_EVEN, UFORM_E4M3_ODD, 32)
#define UFORM_F16(HALF) UFORM_WIDEN(HALF, "", UFORM_F16_EVEN, UFORM_F16_ODD, 64)
#define UFORM_F32(HALF) UFORM_WIDEN(HALF, "", UFORM_F32_EVEN, UFORM_F32_ODD, 128)
#define UFORM_F16S(HALF) UFORM_WIDEN_PF(HALF, "", UFORM_F16S_EVEN, UFORM_F16_ODD, 64, "prefetcht0 %c[reach](%[c])\n\t")
      if constexpr (WT == kBF16 && R == 6) {
        UFORM_BF16(UFORM_HALF6);
      } else if constexpr (WT == kBF16 && R == 5) {
        UFORM_BF16(UFORM_HALF5);
      } else if constexpr (WT == kBF16) {
        UFORM_BF16(UFORM_HALF4);
      } else if constexpr (WT == WIDE && R == 6) {
        UFORM_F32(UFORM_HALF6);
      } else if constexpr (WT == WIDE && R == 5) {
        UFORM_F32(UFORM_HALF5);
      } else if constexpr (WT == WIDE) {
        UFORM_F32(UFORM_HALF4);
      } else if constexpr (WT == STAGING && R == 6) {
        UFORM_F16S(UFORM_HALF6);
      } else if constexpr (WT == STAGING && R == 5) {
        UFORM_F16S(UFORM_HALF5);
      } else if constexpr (WT == STAGING) {
        UFORM_F16S(UFORM_HALF4);
      } else if constexpr (WT == STAGED && R == 6) {
        UFORM_F16(UFORM_HALF6);
      } else if constexpr (WT == STAGED && R == 5) {
        UFORM_F16(UFORM_HALF5);
      } else if constexpr (WT == STAGED) {
        UFORM_F16(UFORM_HALF4);
      } else if constexpr (R == 6) {
        UFORM_E4M3(UFORM_HALF6);
      } else if constexpr (R == 5) {
        UFORM_E4M3(UFORM_HALF5);
      } else {
        UFORM_E4M3(UFORM_HALF4);
      }
#undef UFORM_F32
#undef UFORM_F32_ODD
#undef UFORM_F32_EVEN
#undef UFORM_F16
#undef UFORM_F16S
#undef UFORM_F16S_EVEN
#undef UFORM_STAGE_NEXT
#undef UFORM_WIDEN_PF
#undef UFORM_F16_ODD
#undef UFORM_F16_EVEN
#undef UFORM_E4M3
#undef UFORM_BF16
#undef UFORM_WIDEN
#undef UFORM_PFN
#undef UFORM_E4M3_ODD
#undef UFORM_E4M3_EVEN
#undef UFORM_BF16_ODD
#undef UFORM_BF16_EVEN
#undef UFORM_HALF6
#undef UFORM_HALF5
#undef UFORM_HALF4
#undef UFORM_ROW
      p = full;
      staged_to = full;
    }
  }
  if constexpr (WT == STAGING) {
    if (staged_to < (k + 1) / 2) stage_pairs(src, staged_to, (k + 1) / 2, dst);
  }
  const auto pair = WT == kBF16 ? Widen::bf16 : WT == STAGED || WT == STAGING ? staged : WT == WIDE ? wide : Widen::e4m3;
  for (; p < full; ++p) {
    _mm_prefetch(static_cast<const char*>(w) + p * NR * word + REACH, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(w) + p * NR * word + next, _MM_HINT_T1);
    __m256 e0, e1, o0, o1;
    pair(w, p, e0, e1, o0, o1);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * k + 2 * p);
      acc[r][0] = _mm256_fmadd_ps(a, e0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, e1, acc[r][1]);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * k + 2 * p + 1);
      acc[r][0] = _mm256_fmadd_ps(a, o0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, o1, acc[r][1]);
    }
  }
  if (k % 2) {  // the last pair holds one weight (its odd half is padding; x has no k-th column)
    __m256 e0, e1, o0, o1;
    pair(w, full, e0, e1, o0, o1);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * k + 2 * full);
      acc[r][0] = _mm256_fmadd_ps(a, e0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, e1, acc[r][1]);
    }
  }
  finish<R>(g, row, n0, acc);
}

template <int R, int WT>
static inline void widened_rows(int64_t count, const Gemm& g, int64_t row, int64_t n0, const void* w, int64_t next,
                                const char* src = nullptr, uint16_t* dst = nullptr) {
  if constexpr (R > 0) {
    if (count == R) {
      widened<R, WT>(g, row, n0, w, next, src, dst);
    } else {
      widened_rows<R - 1, WT>(count, g, row, n0, w, next, src, dst);
    }
  }
}

static thread_local Staging staging;  // two panels of F16 bits (the one read and the next) or one of float32

// How `rows` rows read their panels: E4M3 staged as F16 bits (`f16`), panels staged as float32
// by avx2-split (`wide`; SPLIT), or weights widened in registers (neither).
template <bool SPLIT>
struct Reading {
  bool f16, wide;
  Reading(const Gemm& g, int64_t rows)
      : f16(!SPLIT && g.wtype == kE4M3 && rows >= STAGE_FROM),
        wide(SPLIT && rows >= (g.wtype == kBF16 ? WIDE_BF16_FROM : WIDE_E4M3_FROM)) {}
  // the thread's staging room, when the panels are staged (null when not)
  void* room(const Gemm& g) const { return f16 || wide ? staging.fit((g.k + 1) / 2 * 2 * NR * 4) : nullptr; }
};

// Panel j for rows [r0, r1), in groups of at most MR rows as even as can be (13 rows: 5, 4, 4),
// so that no group is a lone row or two whose few sums leave the FMA pipes waiting on their
// latency. `mine`: the panel this thread reads next (-1: none), `ahead`: when there is none, a
// panel another thread may read next (-1: none). The first group of rows fetches the one or
// the other into L2 as it reads this one (BF16's from DRAM: 4-10 % at 6-16 rows; a task's last
// panel fetching the next task's first, short queries +0.3-4.8 %), or, E4M3 staged, stages
// `mine` beside its FMAs: `room` holds two panels of F16 bits, j's in half `turn % 2` and
// `mine`'s then in the other (the first of a thread's panels is staged alone, by its caller).
// E4M3 widened in registers (a single group, half the bytes) fetches nothing ahead (within 2 %);
// panels staged as float32 neither (their 128-byte steps would reach four times past the next).
template <bool SPLIT>
static void run_panel(const Gemm& g, const Reading<SPLIT>& how, int64_t j, int64_t r0, int64_t r1, int64_t mine, int64_t ahead,
                      void* room, int64_t turn) {
  const int64_t pairs = (g.k + 1) / 2, groups = ceil_div(r1 - r0, MR), panel16 = pairs * 2 * NR;
  const int64_t bytes = pairs * NR * (g.wtype == kBF16 ? 4 : 2);  // of a packed panel
  const char* const w = static_cast<const char*>(g.w);
  uint16_t* const here = how.f16 ? static_cast<uint16_t*>(room) + turn % 2 * panel16 : nullptr;
  uint16_t* const there = how.f16 ? static_cast<uint16_t*>(room) + (turn + 1) % 2 * panel16 : nullptr;
  if (how.wide) stage_f32(g, j, static_cast<float*>(room));
  const int64_t fetch = mine >= 0 ? mine : ahead;
  for (int64_t q = 0, row = r0; q < groups; ++q) {
    const int64_t rows = ceil_div(r1 - row, groups - q);
    if (how.wide) {
      widened_rows<MR, WIDE>(rows, g, row, j * NR, room, 0);
    } else if (g.wtype == kBF16) {
      widened_rows<MR, kBF16>(rows, g, row, j * NR, w + j * bytes, q == 0 && fetch >= 0 ? (fetch - j) * bytes : 0);
    } else if (how.f16 && q == 0 && mine >= 0) {
      widened_rows<MR, STAGING>(rows, g, row, j * NR, here, 0, w + mine * bytes, there);
    } else if (how.f16) {
      const int64_t next = q == 0 && ahead >= 0 ? int64_t(reinterpret_cast<intptr_t>(w + ahead * bytes) - reinterpret_cast<intptr_t>(here)) : 0;
      widened_rows<MR, STAGED>(rows, g, row, j * NR, here, next);
    } else {
      widened_rows<MR, kE4M3>(rows, g, row, j * NR, w + j * bytes, 0);
    }
    row += rows;
  }
}

// A thread's first panel staged alone (spans.inc).
static void stage_first(const Gemm& g, int64_t j, void* room) { stage(g, j, static_cast<uint16_t*>(room)); }

#include "spans.inc"

// SPLIT: the avx2-split variant's task (panels staged as float32, see the top of the file).
template <bool SPLIT>
static void task(const Gemm& g, int64_t t) {
  run_task<Reading<SPLIT>>(g, t);
}

}  // namespace avx2

// FLOP/s of 256-bit FMAs on one thread with nothing but registers: 12 independent chains, so
// that both FMA pipes stay full whatever their latency (the class's peak, measured).
double fma_peak_avx2(int64_t iterations) {
  __m256 acc[12];
  for (int u = 0; u < 12; ++u) acc[u] = _mm256_set1_ps(float(u) * 1e-3f);
  const __m256 b = _mm256_set1_ps(0.5f), c = _mm256_set1_ps(0.25f);  // converges to 0.5: no subnormals
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int u = 0; u < 12; ++u) acc[u] = _mm256_fmadd_ps(acc[u], b, c);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sum = 0;
  for (int u = 0; u < 12; ++u) sum += _mm256_cvtss_f32(acc[u]);
  volatile float sink = sum;  // the chains are used
  (void)sink;
  return double(iterations) * 12 * 16 / seconds;
}

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

// Whether this CPU runs 256-bit AVX operations as two 128-bit halves: AMD's CPUID leaf
// 0x8000001A says so in EAX (FP128 set, FP256 clear: Zen 1, Zen+ and Hygon's Dhyana; Zen 2 and
// later set FP256). CPUs without the leaf (Intel's) are taken as full width.
bool splits_256() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x8000001Au) return false;
  __cpuid(0x8000001Au, a, b, c, d);
  return (a & 1u) && !(a & 4u);
}

const Kernel kernel_avx2 = {"avx2", avx2::NR, avx2::PAIR, avx2::MC, false, avx2::task<false>, nullptr, avx2::count};
const Kernel kernel_avx2_split = {"avx2-split", avx2::NR, avx2::PAIR, avx2::MC, false, avx2::task<true>, nullptr, avx2::count};

}  // namespace uform
