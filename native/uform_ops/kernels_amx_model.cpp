// The amx kernels over a scalar model of the tile instructions (the variant `amx-model`), built
// for every machine with the baseline instruction set: tiles.inc's packing, blocking, edges,
// epilogues and configuration handling run and are tested where no CPU has AMX. No load takes
// this variant. The model follows the instructions as Intel's manual states them:
//   - LDTILECFG: palette 1, per tile its rows (<= 16) and bytes a row (<= 64); it zeroes every
//     tile. STTILECFG writes it back, 64 zero bytes when none is loaded. TILERELEASE returns to
//     that init state. A tile instruction with none loaded aborts (the CPU would fault).
//   - TILELOADD / TILESTORED: a tile's rows, `stride` bytes apart; a load zeroes the rest.
//   - TDPBF16PS, as the manual's pseudocode and the real tiles (bit for bit, tests/test_amx.py)
//     do it: for each row m and column n, two float32 sums start at zero, one of the even
//     products a[2k] b[2k] and one of the odd a[2k+1] b[2k+1], each a chain of FMAs over the
//     instruction's pairs k in order (the product exact, one rounding to nearest even a step);
//     then c += (even + odd), rounded once for the inner sum and once for c. BF16 inputs that
//     are subnormal count as zeros; every subnormal float32 result is flushed to zero.
// (VDPBF16PS instead chains a column's odd and even products into one sum: the tiles' bits
// are not avx512-bf16's.)
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "gemm.h"

namespace uform {
namespace amx_model {

struct Tile {
  alignas(64) uint8_t bytes[16][64];
};

struct State {
  alignas(64) uint8_t config[64] = {};  // TileConfig's bytes (tiles.inc); all zero: none loaded
  Tile tile[8] = {};
  int rows(int t) const { return config[48 + t]; }
  int colsb(int t) const { return config[16 + 2 * t] | config[17 + 2 * t] << 8; }
  void check(int t) const {
    if (config[0] != 1 || rows(t) < 1 || rows(t) > 16 || colsb(t) < 4 || colsb(t) > 64) std::abort();
  }
};

static thread_local State state;

static inline void store_config(void* c) { std::memcpy(c, state.config, 64); }
static inline void load_config(const void* c) {
  std::memcpy(state.config, c, 64);
  for (Tile& t : state.tile) std::memset(t.bytes, 0, sizeof t.bytes);
}
static inline void release_tiles() {
  static const uint8_t none[64] = {};
  load_config(none);
}

template <int T>
static inline void tile_load(const void* p, int64_t stride) {
  state.check(T);
  Tile& t = state.tile[T];
  std::memset(t.bytes, 0, sizeof t.bytes);
  for (int r = 0; r < state.rows(T); ++r) std::memcpy(t.bytes[r], static_cast<const uint8_t*>(p) + r * stride, size_t(state.colsb(T)));
}
template <int T>
static inline void tile_zero() {
  state.check(T);
  std::memset(state.tile[T].bytes, 0, sizeof state.tile[T].bytes);
}
template <int T>
static inline void tile_store(void* p, int64_t stride) {
  state.check(T);
  for (int r = 0; r < state.rows(T); ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, state.tile[T].bytes[r], size_t(state.colsb(T)));
}

static inline float bf16(const uint8_t* p) {  // a BF16 value, a subnormal taken as zero
  uint16_t h;
  std::memcpy(&h, p, 2);
  if ((h & 0x7F80u) == 0) h &= 0x8000u;
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline float flush(float v) { return std::fabs(v) < 1.17549435e-38f ? std::copysign(0.0f, v) : v; }  // FLT_MIN

// e + a * b as an FMA rounds it: the product of two BF16 values is exact in float64 and so is
// the sum wherever its bits fit in 53; where they do not, b's product lies far below e's last
// bit and float64's rounding cannot make a tie that float32's would not.
static inline float fma_bf16(float e, float a, float b) { return flush(float(double(e) + double(a) * double(b))); }

template <int C, int A, int B>
static inline void tile_dp() {
  state.check(C), state.check(A), state.check(B);
  const int m_rows = state.rows(C), n_cols = state.colsb(C) / 4, pairs = state.colsb(A) / 4;
  if (state.rows(A) != m_rows || state.rows(B) != pairs || state.colsb(B) != state.colsb(C)) std::abort();  // #UD
  Tile& c = state.tile[C];
  float a[16][32] = {}, b[16][32] = {};  // the BF16 values of A's rows and B's rows of pairs, read once
  for (int r = 0; r < m_rows; ++r)
    for (int i = 0; i < 2 * pairs; ++i) a[r][i] = bf16(state.tile[A].bytes[r] + 2 * i);
  for (int k = 0; k < pairs; ++k)
    for (int i = 0; i < 2 * n_cols; ++i) b[k][i] = bf16(state.tile[B].bytes[k] + 2 * i);
  for (int m = 0; m < m_rows; ++m) {
    float even[16] = {}, odd[16] = {};  // each column's two chains, stepped together (the model's speed)
    for (int k = 0; k < pairs; ++k)
      for (int n = 0; n < 16; ++n) {
        even[n] = fma_bf16(even[n], a[m][2 * k], b[k][2 * n]);
        odd[n] = fma_bf16(odd[n], a[m][2 * k + 1], b[k][2 * n + 1]);
      }
    for (int n = 0; n < n_cols; ++n) {
      float sum;
      std::memcpy(&sum, c.bytes[m] + 4 * n, 4);
      sum = flush(sum + flush(even[n] + odd[n]));
      std::memcpy(c.bytes[m] + 4 * n, &sum, 4);
    }
  }
}

#define TILE_LOAD(T, p, stride) tile_load<T>(p, stride)
#define TILE_ZERO(T) tile_zero<T>()
#define TILE_DP(C, A, B) tile_dp<C, A, B>()
#define TILE_STORE(T, p, stride) tile_store<T>(p, stride)

#define UFORM_VFMA(a, b, c)                                                 \
  ({                                                                        \
    auto a_ = (a), b_ = (b), c_ = (c);                                      \
    for (int i_ = 0; i_ < 16; ++i_) c_[i_] = std::fma(a_[i_], b_[i_], c_[i_]); \
    c_;                                                                     \
  })

#define STORE_STREAM(p, v) std::memcpy(p, &(v), sizeof(v))
#define STREAM_FENCE() ((void)0)
#define FETCH_L2(p) __builtin_prefetch(p, 0, 2)

static void decode(const uint8_t* codes, uint32_t* out, int64_t count) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < count; ++i) dst[i] = e4m3_to_bf16[codes[i]];
}

#include "tiles.inc"
#undef UFORM_VFMA
#undef STORE_STREAM
#undef STREAM_FENCE
#undef FETCH_L2

// x rounded to BF16 as VCVTNE2PS2BF16 rounds it (to nearest even, subnormals to zero, a NaN
// quiet), into the tiles' blocks (x_at).
static void round_rows(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + r * k + i, 4);
      if ((bits & 0x7F800000u) == 0) bits &= 0x80000000u;
      const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
      xb[x_at(r, i, kpad)] = nan ? uint16_t(bits >> 16 | 0x40) : uint16_t((bits + 0x7FFFu + (bits >> 16 & 1)) >> 16);
    }
    for (int64_t i = k; i < kpad; ++i) xb[x_at(r, i, kpad)] = 0;
  }
}

}  // namespace amx_model

// The calling thread's modelled tile configuration (64 bytes), read or set (tests: a product
// leaves it as it found it).
void amx_model_config(uint8_t* out, const uint8_t* in) {
  if (out) std::memcpy(out, amx_model::state.config, 64);
  if (in) amx_model::load_config(in);
}

const Kernel kernel_amx_model = {"amx-model", amx_model::NR, amx_model::PAIR, amx_model::MC, true, amx_model::task,
                                 amx_model::round_rows, amx_model::count, amx_model::KBLOCK};

}  // namespace uform
