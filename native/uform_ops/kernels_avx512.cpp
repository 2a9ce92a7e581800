// AVX-512 F (x86-64-v4): float32 FMA over BF16 or E4M3 weights, widened as they are read —
// the `avx2` kernels' design (kernels_avx2.cpp) at 16 lanes, with 32 registers.
//
// Weights are packed in pairs, [k / 2][32][2] per panel of 32 columns. A BF16 pair is one
// 32-bit word (even weight: shift left 16; odd: mask the high half); an E4M3 pair one 16-bit
// word whose codes become the F16 bits of code * 2^-8 exactly by moving the code to the high
// byte, an arithmetic shift right by 1 and a mask, then vcvtph2ps (the 2^8 comes at the end).
// - BF16 widens in registers at every m.
// - E4M3 widens in registers up to 3 rows. From 4 a thread's panels are staged as F16 bits,
//   which every group of rows converts from memory: its first panel of a product (or task)
//   alone, each next one by the first group of the panel before, inside its FMA loop. From 24
//   rows each panel is staged as float32 (a 512-bit conversion from memory costs more than the
//   load of a float32 on Zen 4).
// Up to 96 rows a product is cut into spans of panels taken one at a time (PanelSpans, gemm.h),
// larger ones into tasks of up to 96 rows times some panels. Each group of up to 8 rows
// (sixteen sums) reads a panel over all of k with its sums in registers (the loop in assembly
// from 4 rows: from intrinsics GCC kept a pointer a row and spilled them), y written once; a
// BF16 pair is two cache lines, both fetched ahead. Every row sums its k in order, one FMA at
// a time, whatever its group: a row's bits do not depend on the rows beside it.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gemm.h"

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file, and a machine
// without these instructions would run it (std::vector<float>::assign did: SIGILL on AVX2).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

namespace uform {
namespace avx512 {

constexpr int64_t NR = 32, MR = 8, PAIR = 2, MC = 96;
constexpr int STAGED = 2;               // `widened`'s weights: E4M3 panels staged as F16 bits (beside kBF16, kE4M3)
constexpr int STAGING = 3;              // STAGED, the group also staging the task's next panel
constexpr int WIDE = 4;                 // E4M3 panels staged as float32
constexpr int64_t WIDE_FROM = 24;       // rows a task from which E4M3 panels are staged as float32
constexpr int64_t STAGE_FROM = 4;       // rows from which E4M3 panels are staged
constexpr int64_t REACH = 2048;         // bytes ahead that weights read from DRAM are fetched

#include "sums512.inc"

// Pair p of a panel as float32, even and odd k, columns 0-15 and 16-31.
static inline void bf16(const void* w, int64_t p, __m512& e0, __m512& e1, __m512& o0, __m512& o1) {
  const uint32_t* at = static_cast<const uint32_t*>(w) + p * NR;
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const __m512i w0 = _mm512_loadu_si512(at), w1 = _mm512_loadu_si512(at + 16);
  e0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
  e1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
  o0 = _mm512_castsi512_ps(_mm512_and_si512(w0, high));
  o1 = _mm512_castsi512_ps(_mm512_and_si512(w1, high));
}

static inline void f16_bits(__m512i v, __m512i& even, __m512i& odd) {
  const __m512i keep = _mm512_set1_epi16(int16_t(0xBF80u));
  even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1), keep);
  odd = _mm512_and_si512(_mm512_srai_epi16(v, 1), keep);
}

static inline void e4m3(const void* w, int64_t p, __m512& e0, __m512& e1, __m512& o0, __m512& o1) {
  __m512i even, odd;
  f16_bits(_mm512_loadu_si512(static_cast<const uint16_t*>(w) + p * NR), even, odd);
  e0 = _mm512_cvtph_ps(_mm512_castsi512_si256(even));
  e1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(even, 1));
  o0 = _mm512_cvtph_ps(_mm512_castsi512_si256(odd));
  o1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(odd, 1));
}

// Staged F16 bits: [k / 2][even 32, odd 32] 16-bit words.
static inline void staged(const void* w, int64_t p, __m512& e0, __m512& e1, __m512& o0, __m512& o1) {
  const __m256i* at = reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + p * 2 * NR);
  e0 = _mm512_cvtph_ps(_mm256_load_si256(at));
  e1 = _mm512_cvtph_ps(_mm256_load_si256(at + 1));
  o0 = _mm512_cvtph_ps(_mm256_load_si256(at + 2));
  o1 = _mm512_cvtph_ps(_mm256_load_si256(at + 3));
}

// The packed E4M3 panel at `at` as float32 (code * 2^-8), [k / 2][even 32, odd 32].
static inline void stage_f32(const char* at, int64_t pairs, float* out) {
  for (int64_t p = 0; p < pairs; ++p) {
    _mm_prefetch(at + p * NR * 2 + REACH, _MM_HINT_T0);
    __m512 e0, e1, o0, o1;
    e4m3(at, p, e0, e1, o0, o1);
    _mm512_store_ps(out + p * 2 * NR, e0);
    _mm512_store_ps(out + p * 2 * NR + 16, e1);
    _mm512_store_ps(out + p * 2 * NR + 32, o0);
    _mm512_store_ps(out + p * 2 * NR + 48, o1);
  }
}

static inline void wide(const void* w, int64_t p, __m512& e0, __m512& e1, __m512& o0, __m512& o1) {
  const float* at = static_cast<const float*>(w) + p * 2 * NR;
  e0 = _mm512_load_ps(at);
  e1 = _mm512_load_ps(at + 16);
  o0 = _mm512_load_ps(at + 32);
  o1 = _mm512_load_ps(at + 48);
}

// Pairs [p0, p1) of the packed E4M3 panel at `at` as F16 bits into `out` (the staged layout).
static inline void stage_pairs(const char* at, int64_t p0, int64_t p1, uint16_t* out) {
  for (int64_t p = p0; p < p1; ++p) {
    __m512i even, odd;
    f16_bits(_mm512_loadu_si512(at + p * NR * 2), even, odd);
    _mm512_store_si512(out + p * 2 * NR, even);
    _mm512_store_si512(out + p * 2 * NR + NR, odd);
  }
}

// Rows [row, row + R) times the panel's 32 columns over all of k (WT: kBF16 or kE4M3 packed
// pairs widened in registers, STAGED F16 bits, or STAGING: STAGED that also stages the packed
// panel `src` into `dst` as it goes). `fetch`: the weights come from DRAM (fetched REACH bytes
// ahead) and `next` bytes past each read is what is fetched into L2 behind it (0: nothing).
template <int R, int WT>
__attribute__((noinline)) static void widened(const Gemm& g, int64_t row, int64_t n0, const void* w, bool fetch,
                                              int64_t next, const char* src, uint16_t* dst) {
  constexpr int64_t step = WT == kE4M3 ? NR * 2 : WT == WIDE ? NR * 8 : NR * 4;  // bytes a pair
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if (g.residual) {  // read at the end: fetched now, while the sums run
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const char* add = reinterpret_cast<const char*>(g.residual + (row + r) * g.n + n0);
      _mm_prefetch(add, _MM_HINT_T0);
      _mm_prefetch(add + 64, _MM_HINT_T0);
    }
  }
  const float* x = g.x + row * g.k;
  const int64_t k = g.k, full = k / 2, pairs = (k + 1) / 2;
  const char* bytes = static_cast<const char*>(w);
  const auto pair = WT == kBF16 ? bf16 : WT == kE4M3 ? e4m3 : WT == WIDE ? wide : staged;  // pair p as float32
  int64_t p = 0;
  static_assert(WT != kE4M3 || R < STAGE_FROM, "E4M3 widens in registers below STAGE_FROM rows only");
  if constexpr (R >= 4) {
    // in assembly from four rows up, as the avx2 kernels (GCC kept a pointer a row and
    // spilled them): twelve sums (or eight, ten), the panel's two vectors, one broadcast, one
    // more; prefetches as the C++ loop below
    if (full > 0) {
      const float* lo = x;
      const float* hi = x + 3 * k;
      const float* far = x + 6 * k;
      const int64_t stride = k * int64_t(sizeof(float));
      int64_t n = full;
      const char* b = bytes;
      const char* c = src;
      uint16_t* d = dst;
      const int64_t reach = fetch ? REACH : 0, ahead = next;  // 0: a prefetch of what is being read, harmless
      alignas(64) __m512 out[MR][2];
      const __m512i mask = WT == kBF16 ? _mm512_set1_epi32(int32_t(0xFFFF0000u)) : _mm512_set1_epi16(int16_t(0xBF80u));
#define UFORM_ROW(u, at, s0, s1)                                                               \
  "vbroadcastss " #u at ", %%zmm18\n\t"                                                         \
  "vfmadd231ps %%zmm16, %%zmm18, %%zmm" #s0 "\n\tvfmadd231ps %%zmm17, %%zmm18, %%zmm" #s1 "\n\t"
#define UFORM_HALF4(u)                                                                          \
  UFORM_ROW(u, "(%[lo])", 0, 1) UFORM_ROW(u, "(%[lo],%[s],1)", 2, 3) UFORM_ROW(u, "(%[lo],%[s],2)", 4, 5) \
  UFORM_ROW(u, "(%[hi])", 6, 7)
#define UFORM_HALF5(u) UFORM_HALF4(u) UFORM_ROW(u, "(%[hi],%[s],1)", 8, 9)
#define UFORM_HALF6(u) UFORM_HALF5(u) UFORM_ROW(u, "(%[hi],%[s],2)", 10, 11)
#define UFORM_HALF7(u) UFORM_HALF6(u) UFORM_ROW(u, "(%[far])", 12, 13)
#define UFORM_HALF8(u) UFORM_HALF7(u) UFORM_ROW(u, "(%[far],%[s],1)", 14, 15)
#define UFORM_BF16_EVEN "vpslld $16, (%[b]), %%zmm16\n\tvpslld $16, 64(%[b]), %%zmm17\n\t"
#define UFORM_BF16_ODD "vpandd (%[b]), %%zmm19, %%zmm16\n\tvpandd 64(%[b]), %%zmm19, %%zmm17\n\t"
#define UFORM_F32_EVEN "vmovaps (%[b]), %%zmm16\n\tvmovaps 64(%[b]), %%zmm17\n\t"
#define UFORM_F32_ODD "vmovaps 128(%[b]), %%zmm16\n\tvmovaps 192(%[b]), %%zmm17\n\t"
#define UFORM_F16_EVEN "vcvtph2ps (%[b]), %%zmm16\n\tvcvtph2ps 32(%[b]), %%zmm17\n\t"
#define UFORM_F16_ODD "vcvtph2ps 64(%[b]), %%zmm16\n\tvcvtph2ps 96(%[b]), %%zmm17\n\t"
#define UFORM_STAGE_NEXT                                                                        \
  "vmovdqu64 (%[c]), %%zmm19\n\tvpsllw $8, %%zmm19, %%zmm18\n\tvpsraw $1, %%zmm18, %%zmm18\n\t"  \
  "vpandd %[mask], %%zmm18, %%zmm18\n\tvmovdqa64 %%zmm18, (%[d])\n\tvpsraw $1, %%zmm19, %%zmm19\n\t" \
  "vpandd %[mask], %%zmm19, %%zmm19\n\tvmovdqa64 %%zmm19, 64(%[d])\n\tprefetcht0 %c[reach_c](%[c])\n\t" \
  "add $64, %[c]\n\tadd $128, %[d]\n\t"
#define UFORM_LOOP(HALF, SETUP, EVEN, ODD, STEP)                                                \
  __asm__ volatile(                                                                             \
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvmovaps %%zmm0, %%zmm1\n\tvmovaps %%zmm0, %%zmm2\n\t"      \
      "vmovaps %%zmm0, %%zmm3\n\tvmovaps %%zmm0, %%zmm4\n\tvmovaps %%zmm0, %%zmm5\n\t"            \
      "vmovaps %%zmm0, %%zmm6\n\tvmovaps %%zmm0, %%zmm7\n\tvmovaps %%zmm0, %%zmm8\n\t"            \
      "vmovaps %%zmm0, %%zmm9\n\tvmovaps %%zmm0, %%zmm10\n\tvmovaps %%zmm0, %%zmm11\n\t"          \
      "vmovaps %%zmm0, %%zmm12\n\tvmovaps %%zmm0, %%zmm13\n\tvmovaps %%zmm0, %%zmm14\n\tvmovaps %%zmm0, %%zmm15\n\t" \
      SETUP                                                                                     \
      ".p2align 5\n\t"                                                                          \
      "1:\n\t"                                                                                  \
      EVEN HALF(0) ODD HALF(4)                                                                  \
      "prefetcht0 (%[b],%[reach],1)\n\t"                                                        \
      "prefetcht0 64(%[b],%[reach],1)\n\t" /* a pair's second line (BF16: 128 bytes a pair) */ \
      "prefetcht1 (%[b],%[ahead],1)\n\t"                                                        \
      "add $" #STEP ", %[b]\n\t"                                                                \
      "add $8, %[lo]\n\t"                                                                       \
      "add $8, %[hi]\n\t"                                                                       \
      "add $8, %[far]\n\t"                                                                      \
      "dec %[n]\n\t"                                                                            \
      "jnz 1b\n\t"                                                                              \
      "vmovaps %%zmm0, 0(%[out])\n\tvmovaps %%zmm1, 64(%[out])\n\tvmovaps %%zmm2, 128(%[out])\n\t" \
      "vmovaps %%zmm3, 192(%[out])\n\tvmovaps %%zmm4, 256(%[out])\n\tvmovaps %%zmm5, 320(%[out])\n\t" \
      "vmovaps %%zmm6, 384(%[out])\n\tvmovaps %%zmm7, 448(%[out])\n\tvmovaps %%zmm8, 512(%[out])\n\t" \
      "vmovaps %%zmm9, 576(%[out])\n\tvmovaps %%zmm10, 640(%[out])\n\tvmovaps %%zmm11, 704(%[out])\n\t" \
      "vmovaps %%zmm12, 768(%[out])\n\tvmovaps %%zmm13, 832(%[out])\n\tvmovaps %%zmm14, 896(%[out])\n\t" \
      "vmovaps %%zmm15, 960(%[out])\n\t"                                                       \
      : [b] "+r"(b), [lo] "+r"(lo), [hi] "+r"(hi), [far] "+r"(far), [n] "+r"(n), [c] "+r"(c), [d] "+r"(d) \
      : [s] "r"(stride), [out] "r"(&out[0][0]), [mask] "m"(mask), [reach] "r"(reach), [ahead] "r"(ahead), \
        [reach_c] "i"(REACH)                                                                        \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "cc", "memory")
#define UFORM_RUN(HALF)                                                                         \
  if constexpr (WT == kBF16) {                                                                  \
    UFORM_LOOP(HALF, "vmovdqa64 %[mask], %%zmm19\n\t", UFORM_BF16_EVEN, UFORM_BF16_ODD, 128);    \
  } else if constexpr (WT == WIDE) {                                                            \
    UFORM_LOOP(HALF, "", UFORM_F32_EVEN, UFORM_F32_ODD, 256);                                   \
  } else if constexpr (WT == STAGING) {                                                         \
    UFORM_LOOP(HALF, "", UFORM_STAGE_NEXT UFORM_F16_EVEN, UFORM_F16_ODD, 128);                 \
  } else {                                                                                      \
    UFORM_LOOP(HALF, "", UFORM_F16_EVEN, UFORM_F16_ODD, 128);                                   \
  }
      if constexpr (R == 8) {
        UFORM_RUN(UFORM_HALF8)
      } else if constexpr (R == 7) {
        UFORM_RUN(UFORM_HALF7)
      } else if constexpr (R == 6) {
        UFORM_RUN(UFORM_HALF6)
      } else if constexpr (R == 5) {
        UFORM_RUN(UFORM_HALF5)
      } else {
        UFORM_RUN(UFORM_HALF4)
      }
#undef UFORM_RUN
#undef UFORM_LOOP
#undef UFORM_STAGE_NEXT
#undef UFORM_F16_ODD
#undef UFORM_F32_ODD
#undef UFORM_F32_EVEN
#undef UFORM_F16_EVEN
#undef UFORM_BF16_ODD
#undef UFORM_BF16_EVEN
#undef UFORM_HALF8
#undef UFORM_HALF7
#undef UFORM_HALF6
#undef UFORM_HALF5
#undef UFORM_HALF4
#undef UFORM_ROW
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][0] = out[r][0], acc[r][1] = out[r][1];
      p = full;
    }
  }
  for (; p < full; ++p) {
    if (fetch) {  // every line of the pair: a BF16 pair of 32 columns is two
      _mm_prefetch(bytes + p * step + REACH, _MM_HINT_T0);
      if constexpr (step > 64) _mm_prefetch(bytes + p * step + REACH + 64, _MM_HINT_T0);
    }
    if (next) _mm_prefetch(bytes + p * step + next, _MM_HINT_T1);
    if constexpr (WT == STAGING) {
      _mm_prefetch(src + p * NR * 2 + REACH, _MM_HINT_T0);
      stage_pairs(src, p, p + 1, dst);
    }
    __m512 e0, e1, o0, o1;
    pair(w, p, e0, e1, o0, o1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * k + 2 * p]);
      acc[r][0] = _mm512_fmadd_ps(a, e0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, e1, acc[r][1]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * k + 2 * p + 1]);
      acc[r][0] = _mm512_fmadd_ps(a, o0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, o1, acc[r][1]);
    }
  }
  if constexpr (WT == STAGING) stage_pairs(src, full, pairs, dst);
  if (k % 2) {  // the last pair holds one weight (its odd half is padding; x has no k-th column)
    __m512 e0, e1, o0, o1;
    pair(w, full, e0, e1, o0, o1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * k + 2 * full]);
      acc[r][0] = _mm512_fmadd_ps(a, e0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, e1, acc[r][1]);
    }
  }
  if (g.wtype == kE4M3) {  // widened weights are code * 2^-8: times 2^8, exact
    const __m512 unit = _mm512_set1_ps(256.0f);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = _mm512_mul_ps(acc[r][0], unit), acc[r][1] = _mm512_mul_ps(acc[r][1], unit);
  }
  store_sums<R, 2>(g, row, n0, true, acc);
}

template <int R, int WT>
static inline void widened_rows(int64_t count, const Gemm& g, int64_t row, int64_t n0, const void* w, bool fetch,
                                int64_t next, const char* src, uint16_t* dst) {
  if constexpr (R > 0) {
    if (count == R) {
      widened<R, WT>(g, row, n0, w, fetch, next, src, dst);
    } else {
      widened_rows<R - 1, WT>(count, g, row, n0, w, fetch, next, src, dst);
    }
  }
}

static thread_local Staging staging;  // two panels of F16 bits: the one read and the next

// How `rows` rows read their panels: E4M3 staged as F16 bits (`f16`) or as float32 (`wide`),
// or weights widened in registers (neither).
struct Reading {
  bool wide, f16;
  Reading(const Gemm& g, int64_t rows)
      : wide(g.wtype == kE4M3 && rows >= WIDE_FROM), f16(g.wtype == kE4M3 && !wide && rows >= STAGE_FROM) {}
  // the thread's staging room (two panels of F16 bits or one of float32), null when not staged
  void* room(const Gemm& g) const { return f16 || wide ? staging.fit((g.k + 1) / 2 * 2 * NR * 4) : nullptr; }
};

// Panel j for rows [r0, r1), in groups of up to MR rows as even as can be (14 rows: 7, 7).
// `mine`: the panel this thread reads next (-1: none), `ahead`: when there is none, a panel
// another thread may read next (-1: none). The first group reads the panel from DRAM and fetches
// the next into L2 behind it, or, E4M3 staged as F16 bits, stages `mine` beside its FMAs: `room`
// holds two panels, j's in half `turn % 2` and `mine`'s then in the other (the first of a
// thread's panels is staged alone, by its caller).
static void run_panel(const Gemm& g, const Reading& how, int64_t j, int64_t r0, int64_t r1, int64_t mine, int64_t ahead,
                      void* room, int64_t turn) {
  const int64_t pairs = (g.k + 1) / 2, groups = ceil_div(r1 - r0, MR), panel16 = pairs * 2 * NR;
  const int64_t bytes = pairs * NR * (g.wtype == kBF16 ? 4 : 2);  // of a packed panel
  const char* const w = static_cast<const char*>(g.w);
  const char* const packed = w + j * bytes;
  uint16_t* const here = how.f16 ? static_cast<uint16_t*>(room) + turn % 2 * panel16 : nullptr;
  uint16_t* const there = how.f16 ? static_cast<uint16_t*>(room) + (turn + 1) % 2 * panel16 : nullptr;
  if (how.wide) stage_f32(packed, pairs, static_cast<float*>(room));
  const int64_t fetch = mine >= 0 ? mine : ahead;
  for (int64_t q = 0, row = r0; q < groups; ++q) {
    const int64_t rows = ceil_div(r1 - row, groups - q);
    if (how.wide) {
      widened_rows<MR, WIDE>(rows, g, row, j * NR, room, false, 0, nullptr, nullptr);
    } else if (how.f16 && q == 0 && mine >= 0) {
      widened_rows<MR, STAGING>(rows, g, row, j * NR, here, false, 0, w + mine * bytes, there);
    } else if (how.f16) {
      const int64_t next = q == 0 && ahead >= 0 ? int64_t(reinterpret_cast<intptr_t>(w + ahead * bytes) - reinterpret_cast<intptr_t>(here)) : 0;
      widened_rows<MR, STAGED>(rows, g, row, j * NR, here, false, next, nullptr, nullptr);
    } else if (g.wtype == kBF16) {
      widened_rows<MR, kBF16>(rows, g, row, j * NR, packed, q == 0, q == 0 && fetch >= 0 ? (fetch - j) * bytes : 0, nullptr, nullptr);
    } else {
      widened_rows<STAGE_FROM - 1, kE4M3>(rows, g, row, j * NR, packed, q == 0, q == 0 && fetch >= 0 ? (fetch - j) * bytes : 0, nullptr, nullptr);
    }
    row += rows;
  }
}

// A thread's first panel staged alone as F16 bits (spans.inc).
static void stage_first(const Gemm& g, int64_t j, void* room) {
  const int64_t pairs = (g.k + 1) / 2;
  stage_pairs(static_cast<const char*>(g.w) + j * pairs * NR * 2, 0, pairs, static_cast<uint16_t*>(room));
}

#include "spans.inc"

static void task(const Gemm& g, int64_t t) { run_task<Reading>(g, t); }

}  // namespace avx512

const Kernel kernel_avx512 = {"avx512", avx512::NR, avx512::PAIR, avx512::MC, false, avx512::task, nullptr, avx512::count};

}  // namespace uform
