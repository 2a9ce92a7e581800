// What the library's files share: the kernel variants and which this CPU runs, product
// serials, packing (pack.cpp), and spreading work over threads outside ONNX Runtime.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gemm.h"

#define UFORM_EXPORT extern "C" __attribute__((visibility("default")))

namespace uform {

extern const Kernel* const kernels[kVariants];

// Whether this CPU has the instructions of `variant` (checked before any of its code runs).
bool runnable(int variant);

// Whether `variant`'s loads run AVX-512's attention kernel (else AVX2's).
inline bool wide_attention(int variant) { return variant == kAVX512 || variant == kAVX512BF16 || variant == kAMX; }

// The calling thread's modelled tile configuration (kernels_amx_model.cpp): copied to `out`,
// then set from `in`, each where not null.
void amx_model_config(uint8_t* out, const uint8_t* in);

// A number no other product had: a thread's decoded panel is reused within one product only.
uint64_t next_serial();

// Rows [begin, end) of w (BF16 bits, [n, k]) written into `out` packed for `kern`, as BF16
// or quantized to E4M3 with a scale per row; answers -1, or the flat index of a weight that
// is NaN or infinite. `out` arrives zeroed (the padding stays zero).
int64_t pack_rows(const uint16_t* w, int64_t k, const Kernel& kern, int wtype, void* out, float* scale, int64_t begin,
                  int64_t end);

// The calling thread's buffers, kept from call to call (a fresh one was paged in and zeroed on
// every product: a quarter of a base fc2's time), page-aligned, at least `bytes` long; throws
// std::bad_alloc. One for x rounded to BF16 (rounded_x: `elements` of them), one for the rows a
// layer norm normalizes before rounding them (layer_norm.cpp), one for a chunk's qkv
// (qkv_attention.cpp).
enum Scratch : int { kRoundedX = 0, kNormalized = 1, kQKV = 2, kScratches = 3 };
void* thread_scratch(Scratch which, size_t bytes);
uint16_t* rounded_x(size_t elements);

// Rows [first, first + rows) of x ([m, d], d a multiple of 32, first a multiple of
// kLayerNormBlock, rows at most that) layer-normalized in float32 (layer_norm.inc) and rounded
// to BF16 into `out` as `variant`'s products read x (Gemm::yb's layout for n = d).
constexpr int64_t kLayerNormBlock = 16;
void layer_norm_block(int variant, const float* x, int64_t d, const float* scale, const float* bias, float epsilon,
                      uint16_t* out, int64_t first, int64_t rows);

// `count` pieces of work over `threads` std::threads (for the ctypes entries, outside ORT).
template <class F>
void spread(int64_t count, int threads, F&& piece) {
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, count)));
  if (threads == 1) {
    for (int64_t i = 0; i < count; ++i) piece(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads - 1; ++t)
    pool.emplace_back([&] {
      for (int64_t i; (i = next++) < count;) piece(i);
    });
  for (int64_t i; (i = next++) < count;) piece(i);
  for (auto& th : pool) th.join();
}

}  // namespace uform
