// AVX2 with FMA (x86-64-v3): float32 FMA over BF16 or E4M3 weights, widened in registers as
// they are read or, for E4M3 at more than 16 rows, decoded a slice at a time into cache.
//
// Weights are packed in pairs, [k / 2][16][2] per panel of 16 columns (as the BF16
// dot-product variant packs them), so that widening costs one instruction per 8 weights
// after the load: a BF16 pair is one 32-bit word whose even weight widens by a shift left of
// 16 and whose odd one by masking the high half; an E4M3 pair is one 16-bit word whose codes
// become the F16 bits of code * 2^-8 exactly (subnormals and zeros included) by moving the
// code to the high byte, an arithmetic shift right by 1 and a mask, then vcvtph2ps; the 2^8
// is applied with the scale.
//
// Widened (`widened`: BF16 at every m, E4M3 at 16 rows or fewer): a task is up to 96 rows
// times 4 panels; each group of up to 6 rows reads a panel's packed pairs over all of k,
// widens them in registers and sums in registers, y written once. The first group reads the
// panel from DRAM (fetched REACH bytes ahead, and the next panel into L2 behind it), the
// others from L1 or L2: what moves from DRAM is the packed weights alone. (A BF16 widen is a
// shift or a mask per 8 weights, on ports the FMAs leave free: six rows ran at the FMA peak.)
//
// Decoded (E4M3 beyond 16 rows, whose widen costs five operations and four conversions per
// 32 weights): a task is a block of rows times a block of panels (`cut`). The depth runs in
// chunks of KC pairs; for each chunk a slice of panels is decoded into the thread's buffer,
// then every 6 x 16 micro-tile of the task's rows runs over every panel of the slice: a
// micro-tile's rows of x (6 x 256 floats) stay in L1 across the slice, and the slice
// (8 panels, 128 KiB) stays in L2 across the rows. Decoding costs 1 / rows of the products.
// While a micro-tile runs it fetches the next group's rows of x (from L3), and the decode
// fetches the next chunk's packed bytes.
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

namespace uform {
namespace avx2 {

constexpr int64_t NR = 16, MR = 6, PAIR = 2;
constexpr int64_t KC = 128;          // pairs per depth chunk (256 k)
constexpr int64_t SLICE = 8;         // panels a task decodes at once at large m: 128 columns x 256 k of float32
constexpr int64_t MC = 96;           // rows per task beyond SMALL
constexpr int64_t SMALL = 16;        // rows at most whose E4M3 weights widen in registers (BF16's: every m)
constexpr int64_t SMALL_PANELS = 4;  // panels per task of the widened path
constexpr int64_t REACH = 2048;      // bytes ahead that weights widened in registers are fetched from DRAM (4 and 8 KiB: the same)
constexpr int64_t TASKS_PER_THREAD = 3;  // narrower tasks until a product has this many a thread (none idles long)
constexpr int64_t UNKNOWN_THREADS = 8;   // what to cut for when the caller did not say

struct Cut {
  int64_t mc;      // rows per task
  int64_t panels;  // panels per task
  int64_t slice;   // panels decoded at once
};

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// BF16 weights widen in registers at every m, E4M3 ones at 16 rows or fewer (below).
static inline bool widens(const Gemm& g) { return g.m <= SMALL || g.wtype == kBF16; }

static Cut cut(const Gemm& g) {
  const bool wide = widens(g);
  Cut c = wide ? Cut{std::clamp<int64_t>(g.m, 1, MC), SMALL_PANELS, 0} : Cut{MC, SLICE, SLICE};
  const int64_t rows = ceil_div(g.m, c.mc), panels = ceil_div(g.n, NR);
  const int64_t least = TASKS_PER_THREAD * (g.threads > 0 ? g.threads : UNKNOWN_THREADS);
  while (c.panels > 1 && rows * ceil_div(panels, c.panels) < least) c.panels /= 2;
  if (!wide) c.slice = c.panels;
  return c;
}

static int64_t count(const Gemm& g) {
  const Cut c = cut(g);
  return ceil_div(g.m, c.mc) * ceil_div(ceil_div(g.n, NR), c.panels);
}

static inline __m256i lanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::clamp<int64_t>(count, 0, 8))), index);
}

// y for rows [row, row + R) and the panel's columns from n0: scale * sum + bias when `last`
// (E4M3's decoded weights are code * 2^-8: the 2^8 comes here), else the raw sums.
template <int R>
static inline void finish(const Gemm& g, int64_t row, int64_t n0, const __m256 (*acc)[2], bool last) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  const __m256i m0 = lanes(cols), m1 = lanes(cols - 8);
  __m256 s0 = _mm256_set1_ps(1.0f), s1 = s0, c0 = _mm256_setzero_ps(), c1 = c0;
  if (last) {
    const __m256 unit = _mm256_set1_ps(g.wtype == kE4M3 ? 256.0f : 1.0f);
    s0 = s1 = unit;
    if (g.scale) {
      s0 = _mm256_mul_ps(unit, _mm256_maskload_ps(g.scale + n0, m0));
      s1 = _mm256_mul_ps(unit, _mm256_maskload_ps(g.scale + n0 + 8, m1));
    }
    if (g.bias) {
      c0 = _mm256_maskload_ps(g.bias + n0, m0);
      c1 = _mm256_maskload_ps(g.bias + n0 + 8, m1);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* y = g.y + (row + r) * g.n + n0;
    const __m256 v0 = last ? _mm256_fmadd_ps(acc[r][0], s0, c0) : acc[r][0];
    const __m256 v1 = last ? _mm256_fmadd_ps(acc[r][1], s1, c1) : acc[r][1];
    if (cols == NR) {
      _mm256_storeu_ps(y, v0);
      _mm256_storeu_ps(y + 8, v1);
    } else {
      _mm256_maskstore_ps(y, m0, v0);
      _mm256_maskstore_ps(y + 8, m1, v1);
    }
  }
}

// Rows [row, row + R) times the panel's 16 columns over k in [k0, k1): sums start at zero
// when `first` (else from y); y gets scale * sum + bias when `last`, else the raw sums.
// `ahead` (or null): the first of six rows of x, a row apart, that the tile fetches into L1
// as it runs (the next group's, the same k).
template <int R>
__attribute__((noinline)) static void micro(const Gemm& g, int64_t row, int64_t n0, const float* panel, int64_t k0, int64_t k1, bool first,
                         bool last, const float* ahead = nullptr) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  const bool whole = cols == NR;
  const __m256i m0 = lanes(cols), m1 = lanes(cols - 8);
  alignas(32) __m256 acc[R + 2][2];  // in memory around the assembly when the tile is partial; then its epilogue
  const bool direct = R == MR && whole && (k1 - k0) % 4 == 0 && k1 - k0 >= 4;
#pragma GCC unroll 6
  for (int r = 0; r < R && !direct; ++r) {
    const float* y = g.y + (row + r) * g.n + n0;
    if (first) {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    } else if (whole) {
      acc[r][0] = _mm256_loadu_ps(y);
      acc[r][1] = _mm256_loadu_ps(y + 8);
    } else {
      acc[r][0] = _mm256_maskload_ps(y, m0);
      acc[r][1] = _mm256_maskload_ps(y + 8, m1);
    }
  }
  // rows 0-2 of x from one pointer, 3-5 from another, at offsets 0, k and 2k: every
  // broadcast addresses base + index * 4 with no arithmetic of its own
  const float* lo = g.x + row * g.k + k0;
  const float* hi = lo + 3 * g.k;
  const int64_t k1x = g.k, k2x = 2 * g.k;
  const float* b = panel;
  int64_t i = k0;
  if constexpr (R == MR) {
    // Four steps a round in assembly (compilers spill a sum or an address here): two loads of
    // the panel, six broadcasts of x addressed off two pointers and the row stride, twelve FMAs
    // a step. The sums start in registers (zero, or y's) and end in y when the tile is whole,
    // without a trip through memory: at 256 k a call, that trip cost 3 % of the product.
    int64_t rounds = (k1 - k0) / 4;
    const int64_t stride = g.k * int64_t(sizeof(float));
    // with nothing to fetch, the rows at hand (in L1 already) are fetched again
    const float* pa = ahead ? ahead : lo;
    const float* pb = pa + 3 * g.k;
    if (rounds > 0) {
      float* epilogue[4] = {reinterpret_cast<float*>(&acc[R][0]), reinterpret_cast<float*>(&acc[R][1]), reinterpret_cast<float*>(&acc[R + 1][0]),
                            reinterpret_cast<float*>(&acc[R + 1][1])};  // scale of columns 0-7 and 8-15, then bias: applied when `last`
      float* ylo = g.y + row * g.n + n0;
      float* yhi = ylo + 3 * g.n;
      const int64_t ystride = g.n * int64_t(sizeof(float));
      int64_t mode = direct ? (first ? 1 : 0) | (last ? 2 : 0) : 4;  // bit 0: start at zero; 1: scale on the way out; 4: via acc
      if (direct && last) {
        const __m256 unit = _mm256_set1_ps(g.wtype == kE4M3 ? 256.0f : 1.0f);  // E4M3 decodes as code * 2^-8
        const __m256 s0 = g.scale ? _mm256_mul_ps(unit, _mm256_loadu_ps(g.scale + n0)) : unit;
        const __m256 s1 = g.scale ? _mm256_mul_ps(unit, _mm256_loadu_ps(g.scale + n0 + 8)) : unit;
        _mm256_store_ps(epilogue[0], s0);
        _mm256_store_ps(epilogue[1], s1);
        _mm256_store_ps(epilogue[2], g.bias ? _mm256_loadu_ps(g.bias + n0) : _mm256_setzero_ps());
        _mm256_store_ps(epilogue[3], g.bias ? _mm256_loadu_ps(g.bias + n0 + 8) : _mm256_setzero_ps());
      }
#define UFORM_STEP(u)                                                                         \
  "vmovaps " #u "*64(%[b]), %%ymm12\n\t"                                                    \
  "vmovaps " #u "*64+32(%[b]), %%ymm13\n\t"                                                 \
  "vbroadcastss " #u "*4(%[lo]), %%ymm14\n\t"                                               \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"                                                \
  "vbroadcastss " #u "*4(%[lo],%[s],1), %%ymm15\n\t"                                        \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm2\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm3\n\t"                                                \
  "vbroadcastss " #u "*4(%[lo],%[s],2), %%ymm14\n\t"                                        \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"                                                \
  "vbroadcastss " #u "*4(%[hi]), %%ymm15\n\t"                                               \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t"                                                \
  "vbroadcastss " #u "*4(%[hi],%[s],1), %%ymm14\n\t"                                        \
  "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"                                                \
  "vbroadcastss " #u "*4(%[hi],%[s],2), %%ymm15\n\t"                                        \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm10\n\t"                                                \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm11\n\t"
      __asm__ volatile(
          "testq $4, %[mode]\n\t"
          "jnz 5f\n\t"
          "testq $1, %[mode]\n\t"
          "jnz 6f\n\t"
          // the sums so far, from y
          "vmovups (%[ylo]), %%ymm0\n\tvmovups 32(%[ylo]), %%ymm1\n\t"
          "vmovups (%[ylo],%[ys],1), %%ymm2\n\tvmovups 32(%[ylo],%[ys],1), %%ymm3\n\t"
          "vmovups (%[ylo],%[ys],2), %%ymm4\n\tvmovups 32(%[ylo],%[ys],2), %%ymm5\n\t"
          "vmovups (%[yhi]), %%ymm6\n\tvmovups 32(%[yhi]), %%ymm7\n\t"
          "vmovups (%[yhi],%[ys],1), %%ymm8\n\tvmovups 32(%[yhi],%[ys],1), %%ymm9\n\t"
          "vmovups (%[yhi],%[ys],2), %%ymm10\n\tvmovups 32(%[yhi],%[ys],2), %%ymm11\n\t"
          "jmp 1f\n\t"
          "6:\n\t"  // the first chunk: from zero
          "vxorps %%ymm0, %%ymm0, %%ymm0\n\tvxorps %%ymm1, %%ymm1, %%ymm1\n\tvxorps %%ymm2, %%ymm2, %%ymm2\n\t"
          "vxorps %%ymm3, %%ymm3, %%ymm3\n\tvxorps %%ymm4, %%ymm4, %%ymm4\n\tvxorps %%ymm5, %%ymm5, %%ymm5\n\t"
          "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\tvxorps %%ymm8, %%ymm8, %%ymm8\n\t"
          "vxorps %%ymm9, %%ymm9, %%ymm9\n\tvxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t"
          "jmp 1f\n\t"
          "5:\n\t"  // a partial tile: from the sums in memory
          "vmovaps 0(%[acc]), %%ymm0\n\tvmovaps 32(%[acc]), %%ymm1\n\tvmovaps 64(%[acc]), %%ymm2\n\t"
          "vmovaps 96(%[acc]), %%ymm3\n\tvmovaps 128(%[acc]), %%ymm4\n\tvmovaps 160(%[acc]), %%ymm5\n\t"
          "vmovaps 192(%[acc]), %%ymm6\n\tvmovaps 224(%[acc]), %%ymm7\n\tvmovaps 256(%[acc]), %%ymm8\n\t"
          "vmovaps 288(%[acc]), %%ymm9\n\tvmovaps 320(%[acc]), %%ymm10\n\tvmovaps 352(%[acc]), %%ymm11\n\t"
          ".p2align 5\n\t"
          "1:\n\t"
          UFORM_STEP(0) UFORM_STEP(1) UFORM_STEP(2) UFORM_STEP(3)
          // the next rows of x, a line at a time, while these run (they come from L3)
          "prefetcht0 (%[pa])\n\tprefetcht0 (%[pa],%[s],1)\n\tprefetcht0 (%[pa],%[s],2)\n\t"
          "prefetcht0 (%[pb])\n\tprefetcht0 (%[pb],%[s],1)\n\tprefetcht0 (%[pb],%[s],2)\n\t"
          "add $16, %[pa]\n\tadd $16, %[pb]\n\t"
          "add $256, %[b]\n\t"
          "add $16, %[lo]\n\t"
          "add $16, %[hi]\n\t"
          "dec %[n]\n\t"
          "jnz 1b\n\t"
          "testq $4, %[mode]\n\t"
          "jnz 7f\n\t"
          "testq $2, %[mode]\n\t"
          "jz 8f\n\t"
          // the last chunk: scale and bias on the way out
          "vmovaps 384(%[acc]), %%ymm12\n\tvmovaps 416(%[acc]), %%ymm13\n\tvmovaps 448(%[acc]), %%ymm14\n\tvmovaps 480(%[acc]), %%ymm15\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm0\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm1\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm2\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm3\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm4\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm5\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm6\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm7\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm8\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm9\n\t"
          "vfmadd213ps %%ymm14, %%ymm12, %%ymm10\n\tvfmadd213ps %%ymm15, %%ymm13, %%ymm11\n\t"
          "8:\n\t"
          "vmovups %%ymm0, (%[ylo])\n\tvmovups %%ymm1, 32(%[ylo])\n\t"
          "vmovups %%ymm2, (%[ylo],%[ys],1)\n\tvmovups %%ymm3, 32(%[ylo],%[ys],1)\n\t"
          "vmovups %%ymm4, (%[ylo],%[ys],2)\n\tvmovups %%ymm5, 32(%[ylo],%[ys],2)\n\t"
          "vmovups %%ymm6, (%[yhi])\n\tvmovups %%ymm7, 32(%[yhi])\n\t"
          "vmovups %%ymm8, (%[yhi],%[ys],1)\n\tvmovups %%ymm9, 32(%[yhi],%[ys],1)\n\t"
          "vmovups %%ymm10, (%[yhi],%[ys],2)\n\tvmovups %%ymm11, 32(%[yhi],%[ys],2)\n\t"
          "jmp 9f\n\t"
          "7:\n\t"
          "vmovaps %%ymm0, 0(%[acc])\n\tvmovaps %%ymm1, 32(%[acc])\n\tvmovaps %%ymm2, 64(%[acc])\n\t"
          "vmovaps %%ymm3, 96(%[acc])\n\tvmovaps %%ymm4, 128(%[acc])\n\tvmovaps %%ymm5, 160(%[acc])\n\t"
          "vmovaps %%ymm6, 192(%[acc])\n\tvmovaps %%ymm7, 224(%[acc])\n\tvmovaps %%ymm8, 256(%[acc])\n\t"
          "vmovaps %%ymm9, 288(%[acc])\n\tvmovaps %%ymm10, 320(%[acc])\n\tvmovaps %%ymm11, 352(%[acc])\n\t"
          "9:\n\t"
          : [b] "+r"(b), [lo] "+r"(lo), [hi] "+r"(hi), [n] "+r"(rounds), [pa] "+r"(pa), [pb] "+r"(pb)
          : [s] "r"(stride), [acc] "r"(&acc[0][0]), [ylo] "r"(ylo), [yhi] "r"(yhi), [ys] "r"(ystride),
            [mode] "m"(mode)
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
            "xmm13", "xmm14", "xmm15", "cc", "memory");
#undef UFORM_STEP
      if (direct) return;
      i = k0 + (k1 - k0) / 4 * 4;
    }
  }
  for (; i < k1; ++i, b += NR, ++lo, ++hi) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float* a = r < 3 ? lo + (r == 0 ? 0 : r == 1 ? k1x : k2x) : hi + (r == 3 ? 0 : r == 4 ? k1x : k2x);
      const __m256 v = _mm256_broadcast_ss(a);
      acc[r][0] = _mm256_fmadd_ps(v, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(v, b1, acc[r][1]);
    }
  }
  finish<R>(g, row, n0, acc, last);
}

template <int R>
static inline void rows(int64_t count, const Gemm& g, int64_t row, int64_t n0, const float* panel, int64_t k0,
                        int64_t k1, bool first, bool last, const float* ahead) {
  if constexpr (R > 0) {
    if (count == R) {
      micro<R>(g, row, n0, panel, k0, k1, first, last, ahead);
    } else {
      rows<R - 1>(count, g, row, n0, panel, k0, k1, first, last, ahead);
    }
  }
}

// Small m: rows [row, row + R) times the 16 columns of panel `w` over all of k, the weights
// widened in registers as they arrive and never stored (at a dozen rows a decoded buffer's
// stores and reloads cost as much as the products). A BF16 pair's word widens by a shift left
// of 16 (even k) and a mask of its high half (odd k); an E4M3 pair's by the F16 trick of
// `decode` and vcvtph2ps. The sums stay in registers from the first k to the last; y is
// written once. Every group of rows reads the panel, the first from DRAM (fetched REACH bytes
// ahead), the others from L1 or L2.
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

// Chunk [p0, p1) of E4M3 panel j's pairs, as float32 [2 * (p1 - p0)][16] (row i: k = 2 * p0 + i;
// BF16 weights are never decoded into memory: they widen in registers). `ahead` (bytes from
// each pair's to the pair the next decode of this task reads, or 0): those are fetched into
// L2 meanwhile, so the next chunk does not wait on DRAM.
static void decode(const Gemm& g, int64_t j, int64_t p0, int64_t p1, float* out, int64_t ahead) {
  const int64_t pairs = (g.k + 1) / 2;
  const char* at = static_cast<const char*>(g.w) + (j * pairs + p0) * NR * 2;
  for (int64_t p = p0; p < p1; ++p, out += 2 * NR) {
    if (ahead && (p - p0) % 2 == 0) _mm_prefetch(at + (p - p0) * NR * 2 + ahead, _MM_HINT_T1);  // 32 bytes a pair
    __m256 e0, e1, o0, o1;
    Widen::e4m3(g.w, j * pairs + p, e0, e1, o0, o1);
    _mm256_store_ps(out, e0);
    _mm256_store_ps(out + 8, e1);
    _mm256_store_ps(out + 16, o0);
    _mm256_store_ps(out + 24, o1);
  }
}

template <int R, int WT>
__attribute__((noinline)) static void widened(const Gemm& g, int64_t row, int64_t n0, const void* w, int64_t next) {
  constexpr int64_t word = WT == kBF16 ? 4 : 2;  // bytes of a column's pair
  alignas(32) __m256 acc[MR][2];                  // R of them used; the assembly writes six
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* x = g.x + row * g.k;
  const int64_t k = g.k, full = k / 2;
  int64_t p = 0;
  if constexpr (R >= 4) {
    // in assembly, as `micro`, from four rows up: twelve sums (or eight, ten), the panel's two
    // vectors, one broadcast, one more. From intrinsics GCC spilled sums: five rows ran at
    // 57 % of the FMA peak against six rows' 100 % (weights in cache, one thread)
    if (full > 0) {
      const float* lo = x;
      const float* hi = x + 3 * k;
      const int64_t stride = k * int64_t(sizeof(float));
      int64_t n = full;
      const char* b = static_cast<const char*>(w);
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
// the next panel, fetched into L2 at the rate this one is read (by the first group only)
#define UFORM_PFN "prefetcht1 (%[b],%[next],1)\n\t"
#define UFORM_WIDEN(HALF, SETUP, EVEN, ODD, STEP)                                               \
  __asm__ volatile(                                                                             \
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\tvxorps %%ymm1, %%ymm1, %%ymm1\n\tvxorps %%ymm2, %%ymm2, %%ymm2\n\t" \
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\tvxorps %%ymm4, %%ymm4, %%ymm4\n\tvxorps %%ymm5, %%ymm5, %%ymm5\n\t" \
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\tvxorps %%ymm7, %%ymm7, %%ymm7\n\tvxorps %%ymm8, %%ymm8, %%ymm8\n\t" \
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\tvxorps %%ymm10, %%ymm10, %%ymm10\n\tvxorps %%ymm11, %%ymm11, %%ymm11\n\t" \
      SETUP                                                                                     \
      ".p2align 5\n\t"                                                                          \
      "1:\n\t"                                                                                  \
      EVEN HALF(0) ODD HALF(4)                                                                  \
      "prefetcht0 %c[reach](%[b])\n\t"                                                          \
      UFORM_PFN                                                                                 \
      "add $" #STEP ", %[b]\n\t"                                                                \
      "add $8, %[lo]\n\t"                                                                       \
      "add $8, %[hi]\n\t"                                                                       \
      "dec %[n]\n\t"                                                                            \
      "jnz 1b\n\t"                                                                              \
      "vmovaps %%ymm0, 0(%[acc])\n\tvmovaps %%ymm1, 32(%[acc])\n\tvmovaps %%ymm2, 64(%[acc])\n\t" \
      "vmovaps %%ymm3, 96(%[acc])\n\tvmovaps %%ymm4, 128(%[acc])\n\tvmovaps %%ymm5, 160(%[acc])\n\t" \
      "vmovaps %%ymm6, 192(%[acc])\n\tvmovaps %%ymm7, 224(%[acc])\n\tvmovaps %%ymm8, 256(%[acc])\n\t" \
      "vmovaps %%ymm9, 288(%[acc])\n\tvmovaps %%ymm10, 320(%[acc])\n\tvmovaps %%ymm11, 352(%[acc])\n\t" \
      : [b] "+r"(b), [lo] "+r"(lo), [hi] "+r"(hi), [n] "+r"(n)                                  \
      : [s] "r"(stride), [acc] "r"(&acc[0][0]), [mask] "m"(mask), [reach] "i"(REACH), [next] "r"(next) \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
        "xmm13", "xmm14", "xmm15", "cc", "memory")
#define UFORM_BF16(HALF) UFORM_WIDEN(HALF, "vmovdqa %[mask], %%ymm15\n\t", UFORM_BF16_EVEN, UFORM_BF16_ODD, 64)
#define UFORM_E4M3(HALF) UFORM_WIDEN(HALF, "", UFORM_E4M3_EVEN, UFORM_E4M3_ODD, 32)
      if constexpr (WT == kBF16 && R == 6) {
        UFORM_BF16(UFORM_HALF6);
      } else if constexpr (WT == kBF16 && R == 5) {
        UFORM_BF16(UFORM_HALF5);
      } else if constexpr (WT == kBF16) {
        UFORM_BF16(UFORM_HALF4);
      } else if constexpr (R == 6) {
        UFORM_E4M3(UFORM_HALF6);
      } else if constexpr (R == 5) {
        UFORM_E4M3(UFORM_HALF5);
      } else {
        UFORM_E4M3(UFORM_HALF4);
      }
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
    }
  }
  const auto pair = WT == kBF16 ? Widen::bf16 : Widen::e4m3;
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
  finish<R>(g, row, n0, acc, true);
}

template <int R, int WT>
static inline void widened_rows(int64_t count, const Gemm& g, int64_t row, int64_t n0, const void* w, int64_t next) {
  if constexpr (R > 0) {
    if (count == R) {
      widened<R, WT>(g, row, n0, w, next);
    } else {
      widened_rows<R - 1, WT>(count, g, row, n0, w, next);
    }
  }
}

struct Buffer {
  float* data = nullptr;
  ~Buffer() { std::free(data); }
};

static thread_local Buffer buffer;  // SLICE decoded panel chunks, allocated once per thread

static constexpr int64_t CHUNK = 2 * KC * NR;  // floats of one decoded panel chunk

static void task(const Gemm& g, int64_t t) {
  const Cut c = cut(g);
  const int64_t blocks = ceil_div(g.m, c.mc), panels = ceil_div(g.n, NR), pairs = (g.k + 1) / 2;
  const int64_t j0 = t / blocks * c.panels, j1 = std::min(panels, j0 + c.panels);
  const int64_t r0 = t % blocks * c.mc, r1 = std::min(g.m, r0 + c.mc);
  // rows in groups of at most MR, as even as can be (13 rows: 5, 4, 4), so that no group is
  // a lone row or two whose few sums leave the FMA pipes waiting on their latency
  const int64_t groups = ceil_div(r1 - r0, MR);
  if (widens(g)) {  // widened in registers, a panel at a time, all of k at once
    const int64_t word = g.wtype == kBF16 ? 4 : 2;  // bytes of a column's pair
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t q = 0, row = r0; q < groups; ++q) {
        const int64_t count = ceil_div(r1 - row, groups - q);
        const void* w = static_cast<const char*>(g.w) + j * pairs * NR * word;
        // the first group of rows also fetches the next panel into L2 as it reads this one
        // from DRAM (BF16: 4-10 % at 6-16 rows; E4M3, half the bytes: within 2 %, so not)
        const int64_t next = q == 0 && j + 1 < j1 && g.wtype == kBF16 ? pairs * NR * word : 0;
        if (g.wtype == kBF16) {
          widened_rows<MR, kBF16>(count, g, row, j * NR, w, next);
        } else {
          widened_rows<MR, kE4M3>(count, g, row, j * NR, w, next);
        }
        row += count;
      }
    return;
  }
  if (buffer.data == nullptr) {
    buffer.data = static_cast<float*>(std::aligned_alloc(64, SLICE * CHUNK * sizeof(float)));
    if (buffer.data == nullptr) std::abort();  // 128 KiB: nothing sensible is left to do
  }
  for (int64_t s0 = j0; s0 < j1; s0 += c.slice) {
    const int64_t s1 = std::min(j1, s0 + c.slice);
    for (int64_t p0 = 0; p0 < pairs; p0 += KC) {
      const int64_t p1 = std::min(pairs, p0 + KC), k0 = 2 * p0, k1 = std::min(g.k, 2 * p1);
      const bool first = p0 == 0, last = p1 == pairs;
      // while this chunk runs, the next one's packed bytes come to L2: this slice's next chunk,
      // or after the last, the next slice's first (streaming from DRAM this was 18 % slower)
      const int64_t word = g.wtype == kBF16 ? 4 : 2;
      const int64_t ahead = p1 < pairs ? KC * NR * word : s1 < j1 ? (c.slice * pairs - p0) * NR * word : 0;
      for (int64_t j = s0; j < s1; ++j) decode(g, j, p0, p1, buffer.data + (j - s0) * CHUNK, ahead);
      for (int64_t q = 0, row = r0; q < groups; ++q) {
        const int64_t count = ceil_div(r1 - row, groups - q);
        for (int64_t j = s0; j < s1; ++j) {
          const float* panel = buffer.data + (j - s0) * CHUNK;
          // the last panel's tile fetches the next group's rows of x (after the last group,
          // the next chunk's first), which come from L3
          const float* ahead = nullptr;
          if (j == s1 - 1) ahead = q + 1 < groups ? g.x + (row + count) * g.k + k0 : (k1 < g.k ? g.x + r0 * g.k + k1 : nullptr);
          if (count == MR) {
            micro<MR>(g, row, j * NR, panel, k0, k1, first, last, ahead);
          } else {
            rows<MR - 1>(count, g, row, j * NR, panel, k0, k1, first, last, ahead);
          }
        }
        row += count;
      }
    }
  }
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

const Kernel kernel_avx2 = {"avx2", avx2::NR, avx2::PAIR, avx2::MC, false, avx2::task, nullptr, avx2::count};

}  // namespace uform
