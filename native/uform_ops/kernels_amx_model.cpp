// The amx kernels over a scalar model of the tile instructions (the variant `amx-model`), built
// for every machine with the baseline instruction set: tiles.inc's packing, blocking, edges,
// epilogues and configuration handling run and are tested where no CPU has AMX. No load takes
// this variant. The model (tile_model.inc) follows the instructions as Intel's manual states them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "gemm.h"

namespace uform {
namespace amx_model {

#include "tile_model.inc"

#define UFORM_VFMA(a, b, c)                                                 \
  ({                                                                        \
    auto a_ = (a), b_ = (b), c_ = (c);                                      \
    for (int i_ = 0; i_ < 16; ++i_) c_[i_] = std::fma(a_[i_], b_[i_], c_[i_]); \
    c_;                                                                     \
  })

#define STORE_STREAM(p, v) std::memcpy(p, &(v), sizeof(v))
#define STREAM_FENCE() ((void)0)
#define FETCH_L2(p) __builtin_prefetch(p, 0, 2)

// x rounded to BF16 as VCVTNE2PS2BF16 rounds it (to nearest even, subnormals to zero, a NaN quiet).
static inline uint16_t round_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7F800000u) == 0) bits &= 0x80000000u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return nan ? uint16_t(bits >> 16 | 0x40) : uint16_t((bits + 0x7FFFu + (bits >> 16 & 1)) >> 16);
}

#define HAND_BF16(p, v, stream)                                  \
  do {                                                           \
    for (int i_ = 0; i_ < 16; ++i_) (p)[i_] = round_bf16((v)[i_]); \
  } while (0)

static void decode(const uint8_t* codes, uint32_t* out, int64_t count) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < count; ++i) dst[i] = e4m3_to_bf16[codes[i]];
}

#include "tiles.inc"
#undef UFORM_VFMA
#undef STORE_STREAM
#undef STREAM_FENCE
#undef FETCH_L2
#undef HAND_BF16

// x rounded to BF16 (round_bf16) into the tiles' blocks (x_at).
static void round_rows(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t i = 0; i < k; ++i) xb[x_at(r, i, kpad)] = round_bf16(x[r * k + i]);
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
