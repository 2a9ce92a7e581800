// AMX (x86-64-amx: Intel Xeon 4th generation and later): BF16 tile products (TDPBF16PS, 16 x 16
// x 32 a product) with float32 sums, over tiles.inc's micro-kernel. Activations are rounded to
// BF16 once per product and weights decode to BF16 exactly, as for avx512-bf16, whose AVX-512
// pieces (rounding, E4M3 decoding) these kernels share. E4M3 panels are decoded into the
// thread's BF16 slots once and reused for all the row blocks of its tasks (tiles.inc).
//
// Every product runs on the tiles, whatever its rows, so that a row's bits are the same in any
// batch: VDPBF16PS sums a column's products in one chain, a tile in two (even and odd k) over
// each 32 of k (kernels_amx_model.cpp), so no other kernel gives the tiles' bits. At 1-4 rows
// a product streams its weights once either way (docs/op-library.md, "The amx kernels").
//
// Before the first tile instruction, Linux must grant the process the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), kernel 5.16 and later): amx_refusal()
// asks once and says why not; nothing here runs a tile instruction unless it answered null.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <utility>

#include "gemm.h"

namespace uform {

namespace {
constexpr int kTileData = 18;  // XFEATURE_XTILEDATA; its configuration (17) comes with it
constexpr int kGetPermission = 0x1022, kRequestPermission = 0x1023;  // ARCH_GET_XCOMP_PERM, ARCH_REQ_XCOMP_PERM

const char* ask_for_tiles() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1))
    return "this CPU has no AMX-BF16 tiles";
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 >> 5 & 1) || !(b >> 16 & 1) || !(b >> 30 & 1))
    return "this CPU has AMX but not the AVX-512 BF16 instructions the amx kernels also run";
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return "the operating system does not enable XSAVE";
  unsigned low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  if ((low >> 17 & 3) != 3)
    return "the operating system (or the hypervisor) does not enable the tile state (XCR0 lacks TILECFG and TILEDATA)";
#if defined(__linux__) && defined(SYS_arch_prctl)
  if (syscall(SYS_arch_prctl, kRequestPermission, kTileData) != 0) {
    switch (errno) {
      case EINVAL:
        return "Linux refused the tile state (ARCH_REQ_XCOMP_PERM: a kernel older than 5.16?)";
      case ENOSPC:  // the kernel checks every thread's sigaltstack against the larger signal frame
        return "Linux refused the tile state: a thread's alternate signal stack (sigaltstack) is too small for it";
      default:
        return "Linux refused the tile state (ARCH_REQ_XCOMP_PERM failed)";
    }
  }
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kGetPermission, &granted) != 0 || !(granted >> kTileData & 1))
    return "Linux did not grant the tile state (ARCH_GET_XCOMP_PERM)";
  return nullptr;
#else
  return "uform asks for the tile state on Linux only";
#endif
}

}  // namespace

const char* amx_refusal() {
  static const char* const why = ask_for_tiles();
  return why;
}

}  // namespace uform

// Only after every include: a template or inline function from a header compiled under this
// target would be a weak symbol that the linker may keep for every file (kernels_avx512bf16.cpp).
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,prfchw")

namespace uform {
namespace amx {

#define TILE_LOAD(T, p, stride) _tile_loadd(T, p, stride)
#define TILE_ZERO(T) _tile_zero(T)
#define TILE_DP(C, A, B) _tile_dpbf16ps(C, A, B)
#define TILE_STORE(T, p, stride) _tile_stored(T, p, stride)
static inline void store_config(void* c) { _tile_storeconfig(c); }
static inline void load_config(const void* c) { _tile_loadconfig(c); }
static inline void release_tiles() { _tile_release(); }

#define UFORM_VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define STORE_STREAM(p, v) _mm512_stream_ps(p, (__m512)(v))
#define STREAM_FENCE() _mm_sfence()
#define HAND_BF16(p, v, stream)                                                    \
  do {                                                                             \
    const __m256i bits_ = (__m256i)_mm512_cvtneps_pbh((__m512)(v));                \
    if (stream)                                                                    \
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits_);                   \
    else                                                                           \
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits_);                   \
  } while (0)
#define FETCH_L2(p) _mm_prefetch(p, _MM_HINT_T1)

static void decode(const uint8_t* codes, uint32_t* out, int64_t count) {
  decode_e4m3_bf16_avx512(codes, reinterpret_cast<uint16_t*>(out), count);
}

#include "tiles.inc"
#undef UFORM_VFMA
#undef STORE_STREAM
#undef STREAM_FENCE
#undef HAND_BF16
#undef FETCH_L2

static inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// Rows [begin, end) of x rounded to BF16 (to nearest even, as avx512-bf16 rounds them) into the
// tiles' blocks (x_at), zeros from k to kpad.
static void round_rows(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* src = x + r * k;
    for (int64_t i = 0; i < kpad; i += 32) {
      const bool whole = i + 32 <= k;
      const __m512 lo = whole ? _mm512_loadu_ps(src + i) : _mm512_maskz_loadu_ps(lanes(k - i), src + i);
      const __m512 hi = whole ? _mm512_loadu_ps(src + i + 16) : _mm512_maskz_loadu_ps(lanes(k - i - 16), src + i + 16);
      _mm512_storeu_si512(xb + x_at(r, i, kpad), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

}  // namespace amx

double tile_peak_amx(int64_t iterations) {
  using namespace amx;
  const Scope scope;
  // Non-zero BF16 operands, magnitudes 1 to 2 with random signs (a fixed generator): the power
  // and clock the tiles get on real data, not on zeros (measured alike here: 3,418 against
  // 3,450 GFLOP/s a thread); sums of a few thousand terms a step, far from any overflow.
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  uint32_t state = 0x9E3779B9u;
  for (int i = 0; i < 16 * 32; ++i) {
    state = state * 1664525u + 1013904223u;
    a[i] = uint16_t(0x3F80u | (state >> 16 & 0x807Fu));  // sign, exponent of 1, 7 random mantissa bits
    state = state * 1664525u + 1013904223u;
    b[i] = uint16_t(0x3F80u | (state >> 16 & 0x807Fu));
  }
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // The thread's CPU time, not the wall's: on a shared machine the probe's threads may wait for
  // a core, and a peak measured through those waits would make every share of it look larger.
  timespec start{}, stop{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(3, 4, 6);
  }
  alignas(64) float sink[256];
  _tile_stored(0, sink, 64);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &stop);
  const double seconds = double(stop.tv_sec - start.tv_sec) + 1e-9 * double(stop.tv_nsec - start.tv_nsec);
  volatile float used = sink[0];
  (void)used;
  return double(iterations) * 4 * (16.0 * 16 * 32 * 2) / seconds;
}

const Kernel kernel_amx = {"amx", amx::NR, amx::PAIR, amx::MC, true, amx::task, amx::round_rows, amx::count, amx::KBLOCK};

}  // namespace uform
