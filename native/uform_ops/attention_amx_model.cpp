// Attention on the tiles for the amx-model variant: attention_tiles.inc over a scalar model of
// the tile instructions, built with the baseline instruction set, so that the tile attention is
// tested on every machine and, where AMX runs, found bit for bit the amx variant's
// (tests/test_attention_tiles.py). The model is kernels_amx_model.cpp's (tile_model.inc; Intel's manual:
// LDTILECFG zeroes the tiles; TDPBF16PS sums a row's even and odd products in two float32
// chains of FMAs over the instruction's pairs, then adds even + odd to C; BF16 subnormal inputs
// read as zeros, subnormal float32 results flushed), with a configuration of its own: this
// file's tasks keep to it as attention_amx.cpp's keep to the CPU's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attention.h"

namespace uform {
namespace {

#include "tile_model.inc"

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
