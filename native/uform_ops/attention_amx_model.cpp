// Attention on the tiles for the amx-model variant: attention_tiles.inc over a scalar model of
// the tile instructions, built with the baseline instruction set, so that the tile attention is
// tested on every machine and, where AMX runs, found bit for bit the amx variant's
// (tests/test_attention_tiles.py). The model follows kernels_amx_model.cpp's (Intel's manual:
// LDTILECFG zeroes the tiles; TDPBF16PS sums a row's even and odd products in two float32
// chains of FMAs over the instruction's pairs, then adds even + odd to C; BF16 subnormal inputs
// read as zeros, subnormal float32 results flushed), with a configuration of its own: this
// file's tasks keep to it as attention_amx.cpp's keep to the CPU's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attention.h"

namespace uform {
namespace {

struct Tile {
  alignas(64) uint8_t bytes[16][64];
};

struct State {
  alignas(64) uint8_t config[64] = {};  // TileConfig's bytes; all zero: none loaded
  Tile tile[8] = {};
  int rows(int t) const { return config[48 + t]; }
  int colsb(int t) const { return config[16 + 2 * t] | config[17 + 2 * t] << 8; }
  void check(int t) const {
    if (config[0] != 1 || rows(t) < 1 || rows(t) > 16 || colsb(t) < 4 || colsb(t) > 64) std::abort();  // the CPU would fault
  }
};

thread_local State state;

inline void store_config(void* c) { std::memcpy(c, state.config, 64); }
inline void load_config(const void* c) {
  std::memcpy(state.config, c, 64);
  for (Tile& t : state.tile) std::memset(t.bytes, 0, sizeof t.bytes);
}
inline void release_tiles() {
  static const uint8_t none[64] = {};
  load_config(none);
}

template <int T>
inline void tile_load(const void* p, int64_t stride) {
  state.check(T);
  Tile& t = state.tile[T];
  std::memset(t.bytes, 0, sizeof t.bytes);
  for (int r = 0; r < state.rows(T); ++r) std::memcpy(t.bytes[r], static_cast<const uint8_t*>(p) + r * stride, size_t(state.colsb(T)));
}
template <int T>
inline void tile_zero() {
  state.check(T);
  std::memset(state.tile[T].bytes, 0, sizeof state.tile[T].bytes);
}
template <int T>
inline void tile_store(void* p, int64_t stride) {
  state.check(T);
  for (int r = 0; r < state.rows(T); ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, state.tile[T].bytes[r], size_t(state.colsb(T)));
}

inline float bf16(const uint8_t* p) {  // a BF16 value, a subnormal taken as zero
  uint16_t h;
  std::memcpy(&h, p, 2);
  if ((h & 0x7F80u) == 0) h &= 0x8000u;
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float flush(float v) { return std::fabs(v) < 1.17549435e-38f ? std::copysign(0.0f, v) : v; }  // FLT_MIN

// e + a * b as an FMA rounds it (kernels_amx_model.cpp says why float64 gets it right).
inline float fma_bf16(float e, float a, float b) { return flush(float(double(e) + double(a) * double(b))); }

template <int C, int A, int B>
inline void tile_dp() {
  state.check(C), state.check(A), state.check(B);
  const int m_rows = state.rows(C), n_cols = state.colsb(C) / 4, pairs = state.colsb(A) / 4;
  if (state.rows(A) != m_rows || state.rows(B) != pairs || state.colsb(B) != state.colsb(C)) std::abort();  // #UD
  Tile& c = state.tile[C];
  float a[16][32] = {}, b[16][32] = {};
  for (int r = 0; r < m_rows; ++r)
    for (int i = 0; i < 2 * pairs; ++i) a[r][i] = bf16(state.tile[A].bytes[r] + 2 * i);
  for (int k = 0; k < pairs; ++k)
    for (int i = 0; i < 2 * n_cols; ++i) b[k][i] = bf16(state.tile[B].bytes[k] + 2 * i);
  for (int m = 0; m < m_rows; ++m) {
    float even[16] = {}, odd[16] = {};
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
#define UFORM_VFMA(a, b, c)                                                    \
  ({                                                                           \
    F a_ = (a), b_ = (b), c_ = (c);                                            \
    for (int i_ = 0; i_ < 16; ++i_) c_[i_] = std::fma(a_[i_], b_[i_], c_[i_]); \
    c_;                                                                        \
  })
#define ROUND_BF16(x) round_bf16(x)
#define PAIR_BF16(even, odd) (widen(round_bf16(even)) | widen(round_bf16(odd)) << 16)

#include "attention_tiles.inc"

}  // namespace

void attention_tasks_amx_model(const Attention& a, int64_t begin, int64_t end) { tile_tasks(a, begin, end); }

}  // namespace uform
