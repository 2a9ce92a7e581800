// AVX2 with FMA (x86-64-v3): float32 FMA over BF16 or E4M3 weights, decoded a slice at a time.
//
// Weights are packed in pairs, [k / 2][16][2] per panel of 16 columns (as the BF16
// dot-product variant packs them), so that decoding costs one instruction per 8 weights
// after the load: a BF16 pair is one 32-bit word whose even weight widens by a shift left of
// 16 and whose odd one by masking the high half; an E4M3 pair is one 16-bit word whose codes
// become the F16 bits of code * 2^-8 exactly (subnormals and zeros included) by moving the
// code to the high byte, an arithmetic shift right by 1 and a mask, then vcvtph2ps; the 2^8
// is applied with the scale.
//
// A task is a block of rows times a block of panels (its size chosen by the product's shape,
// `cut`). The depth runs in chunks of KC pairs; for each chunk a slice of panels is decoded
// into the thread's buffer, then every 6 x 16 micro-tile of the task's rows runs over every
// panel of the slice: a micro-tile's rows of x (6 x 256 floats) stay in L1 across the slice,
// and the slice (8 panels, 128 KiB, at large m; one panel, 16 KiB, in L1, at m <= 16, where
// the weights are used by so few rows that only their packed bytes should move) stays in
// cache across the rows. Decoding costs 1 / rows of the products.
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
constexpr int64_t KC = 128;         // pairs per depth chunk (256 k)
constexpr int64_t SLICE = 8;        // panels a task decodes at once at large m: 128 columns x 256 k of float32
constexpr int64_t MC = 96;          // rows per task at large m
constexpr int64_t SMALL = 16;       // rows at most for the small-m cut: one block of rows, a panel decoded at a time
constexpr int64_t SMALL_PANELS = 4; // panels per task at small m
constexpr int64_t TASKS_PER_THREAD = 3;  // narrower tasks until a product has this many a thread (none idles long)
constexpr int64_t UNKNOWN_THREADS = 8;   // what to cut for when the caller did not say

struct Cut {
  int64_t mc;      // rows per task
  int64_t panels;  // panels per task
  int64_t slice;   // panels decoded at once
};

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static Cut cut(const Gemm& g) {
  if (g.m <= SMALL) return {std::max<int64_t>(g.m, 1), SMALL_PANELS, 1};
  Cut c{MC, SLICE, SLICE};
  const int64_t rows = ceil_div(g.m, MC), panels = ceil_div(g.n, NR);
  const int64_t least = TASKS_PER_THREAD * (g.threads > 0 ? g.threads : UNKNOWN_THREADS);
  while (c.panels > 1 && rows * ceil_div(panels, c.panels) < least) c.panels /= 2;
  c.slice = c.panels;
  return c;
}

static int64_t count(const Gemm& g) {
  const Cut c = cut(g);
  return ceil_div(g.m, c.mc) * ceil_div(ceil_div(g.n, NR), c.panels);
}

// Chunk [p0, p1) of panel j's pairs, as float32 [2 * (p1 - p0)][16] (row i: k = 2 * p0 + i).
static void decode(const Gemm& g, int64_t j, int64_t p0, int64_t p1, float* out) {
  const int64_t pairs = (g.k + 1) / 2;
  if (g.wtype == kBF16) {
    const uint32_t* src = static_cast<const uint32_t*>(g.w) + (j * pairs + p0) * NR;
    const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
    for (int64_t p = p0; p < p1; ++p, src += NR, out += 2 * NR) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8));
      _mm256_store_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)));
      _mm256_store_ps(out + 8, _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)));
      _mm256_store_ps(out + 16, _mm256_castsi256_ps(_mm256_and_si256(w0, high)));
      _mm256_store_ps(out + 24, _mm256_castsi256_ps(_mm256_and_si256(w1, high)));
    }
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(g.w) + (j * pairs + p0) * NR;
  const __m256i keep = _mm256_set1_epi16(int16_t(0xBF80u));  // sign, exponent, 3 mantissa bits of F16
  for (int64_t p = p0; p < p1; ++p, src += NR, out += 2 * NR) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), keep);
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(v, 1), keep);
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm256_castsi256_si128(even)));
    _mm256_store_ps(out + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(even, 1)));
    _mm256_store_ps(out + 16, _mm256_cvtph_ps(_mm256_castsi256_si128(odd)));
    _mm256_store_ps(out + 24, _mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1)));
  }
}

static inline __m256i lanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::clamp<int64_t>(count, 0, 8))), index);
}

// Rows [row, row + R) times the panel's 16 columns over k in [k0, k1): sums start at zero
// when `first` (else from y); y gets scale * sum + bias when `last`, else the raw sums.
template <int R>
__attribute__((noinline)) static void micro(const Gemm& g, int64_t row, int64_t n0, const float* panel, int64_t k0, int64_t k1, bool first,
                         bool last) {
  const int64_t cols = std::min<int64_t>(NR, g.n - n0);
  const bool whole = cols == NR;
  const __m256i m0 = lanes(cols), m1 = lanes(cols - 8);
  alignas(32) __m256 acc[R][2];  // in memory around the assembly (one load and store of each a call)
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
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
    // a step.
    int64_t rounds = (k1 - k0) / 4;
    const int64_t stride = g.k * int64_t(sizeof(float));
    if (rounds > 0) {
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
          "vmovaps 0(%[acc]), %%ymm0\n\tvmovaps 32(%[acc]), %%ymm1\n\tvmovaps 64(%[acc]), %%ymm2\n\t"
          "vmovaps 96(%[acc]), %%ymm3\n\tvmovaps 128(%[acc]), %%ymm4\n\tvmovaps 160(%[acc]), %%ymm5\n\t"
          "vmovaps 192(%[acc]), %%ymm6\n\tvmovaps 224(%[acc]), %%ymm7\n\tvmovaps 256(%[acc]), %%ymm8\n\t"
          "vmovaps 288(%[acc]), %%ymm9\n\tvmovaps 320(%[acc]), %%ymm10\n\tvmovaps 352(%[acc]), %%ymm11\n\t"
          "1:\n\t"
          UFORM_STEP(0) UFORM_STEP(1) UFORM_STEP(2) UFORM_STEP(3)
          "add $256, %[b]\n\t"
          "add $16, %[lo]\n\t"
          "add $16, %[hi]\n\t"
          "dec %[n]\n\t"
          "jnz 1b\n\t"
          "vmovaps %%ymm0, 0(%[acc])\n\tvmovaps %%ymm1, 32(%[acc])\n\tvmovaps %%ymm2, 64(%[acc])\n\t"
          "vmovaps %%ymm3, 96(%[acc])\n\tvmovaps %%ymm4, 128(%[acc])\n\tvmovaps %%ymm5, 160(%[acc])\n\t"
          "vmovaps %%ymm6, 192(%[acc])\n\tvmovaps %%ymm7, 224(%[acc])\n\tvmovaps %%ymm8, 256(%[acc])\n\t"
          "vmovaps %%ymm9, 288(%[acc])\n\tvmovaps %%ymm10, 320(%[acc])\n\tvmovaps %%ymm11, 352(%[acc])\n\t"
          : [b] "+r"(b), [lo] "+r"(lo), [hi] "+r"(hi), [n] "+r"(rounds)
          : [s] "r"(stride), [acc] "r"(&acc[0][0])
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
            "xmm13", "xmm14", "xmm15", "cc", "memory");
#undef UFORM_STEP
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
  __m256 s0 = _mm256_set1_ps(1.0f), s1 = s0, c0 = _mm256_setzero_ps(), c1 = c0;
  if (last) {
    const __m256 unit = _mm256_set1_ps(g.wtype == kE4M3 ? 256.0f : 1.0f);  // E4M3 decodes as code * 2^-8
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
    if (whole) {
      _mm256_storeu_ps(y, v0);
      _mm256_storeu_ps(y + 8, v1);
    } else {
      _mm256_maskstore_ps(y, m0, v0);
      _mm256_maskstore_ps(y + 8, m1, v1);
    }
  }
}

template <int R>
static inline void rows(int64_t count, const Gemm& g, int64_t row, int64_t n0, const float* panel, int64_t k0,
                        int64_t k1, bool first, bool last) {
  if constexpr (R > 0) {
    if (count == R) {
      micro<R>(g, row, n0, panel, k0, k1, first, last);
    } else {
      rows<R - 1>(count, g, row, n0, panel, k0, k1, first, last);
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
  if (buffer.data == nullptr) {
    buffer.data = static_cast<float*>(std::aligned_alloc(64, SLICE * CHUNK * sizeof(float)));
    if (buffer.data == nullptr) std::abort();  // 128 KiB: nothing sensible is left to do
  }
  const Cut c = cut(g);
  const int64_t blocks = ceil_div(g.m, c.mc), panels = ceil_div(g.n, NR), pairs = (g.k + 1) / 2;
  const int64_t j0 = t / blocks * c.panels, j1 = std::min(panels, j0 + c.panels);
  const int64_t r0 = t % blocks * c.mc, r1 = std::min(g.m, r0 + c.mc);
  // rows in groups of at most MR, as even as can be (13 rows: 5, 4, 4), so that no group is
  // a lone row or two whose few sums leave the FMA pipes waiting on their latency
  const int64_t groups = ceil_div(r1 - r0, MR);
  for (int64_t s0 = j0; s0 < j1; s0 += c.slice) {  // at small m a slice is one panel: its bytes are read in order
    const int64_t s1 = std::min(j1, s0 + c.slice);
    for (int64_t p0 = 0; p0 < pairs; p0 += KC) {
      const int64_t p1 = std::min(pairs, p0 + KC), k0 = 2 * p0, k1 = std::min(g.k, 2 * p1);
      const bool first = p0 == 0, last = p1 == pairs;
      for (int64_t j = s0; j < s1; ++j) decode(g, j, p0, p1, buffer.data + (j - s0) * CHUNK);
      for (int64_t q = 0, row = r0; q < groups; ++q) {
        const int64_t count = ceil_div(r1 - row, groups - q);
        for (int64_t j = s0; j < s1; ++j) {
          const float* panel = buffer.data + (j - s0) * CHUNK;
          if (count == MR) {
            micro<MR>(g, row, j * NR, panel, k0, k1, first, last);
          } else {
            rows<MR - 1>(count, g, row, j * NR, panel, k0, k1, first, last);
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
