// A layer norm whose output goes to one product as its x, rounded to BF16 in that product's
// layout (the op LayerNormHandoff, layer_norm_op.cpp): the rows normalized in float32 (layer_norm.inc) a
// block of 16 at a time into the thread's scratch, then rounded by the variant's round_rows.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "library.h"

namespace uform {
namespace ln_plain {
#include "layer_norm.inc"
}  // namespace ln_plain

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace ln_wide {
#include "layer_norm.inc"
}  // namespace ln_wide
#pragma GCC pop_options

void layer_norm_block(int variant, const float* x, int64_t d, const float* scale, const float* bias, float epsilon,
                      uint16_t* out, int64_t first, int64_t rows) {
  float* normalized = nullptr;
  try {  // on one of ONNX Runtime's threads, where an exception would end the process anyway
    normalized = static_cast<float*>(thread_scratch(kNormalized, size_t(kLayerNormBlock * d) * sizeof(float)));
  } catch (const std::bad_alloc&) {
    std::abort();  // 16 rows: nothing sensible is left to do
  }
  const bool wide = variant == kAVX512BF16 || variant == kAMX;  // the variants that run on AVX-512
  (wide ? ln_wide::normalize_rows : ln_plain::normalize_rows)(x + first * d, d, scale, bias, epsilon, normalized, rows);
  // first is a multiple of 16: block `first` of the layout starts first * d values in, in
  // amx's blocks of 16 rows as in avx512-bf16's rows
  kernels[variant]->round_rows(normalized, d, out + first * d, d, 0, rows);
}

}  // namespace uform
