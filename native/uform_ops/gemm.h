// The matrix product every kernel variant computes, and what the variants export.
//
//   y[m, n] = act(scale[n] * sum_k x[m, k] * w[n, k] + bias[n]) + residual[m, n]
//
// act is the identity or GELU (exact, gelu.inc) and residual an optional [m, n] float32 matrix:
// a block's fc1 and GELU, or a projection and the residual add after it, in one pass over y.
// x is float32 [m, k] (row stride k); w holds the checkpoint's [n, k] matrix as raw bits,
// BF16 (uint16) or FLOAT8 E4M3FN (uint8), packed at load for the variant (pack.cpp): panels
// of `nr` output columns, each [k / pair][nr][pair] with pair = 2 for avx512-bf16, avx2 and avx2-split
// and 1 for avx512, zero-padded past n and k. scale (E4M3's per-output-channel scale) and
// bias may be null. Work is cut into tasks (panels of output columns times a block of rows)
// that any thread may run in any order: each writes its own part of y only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace uform {

enum WeightType : int { kBF16 = 0, kE4M3 = 1 };
enum Activation : int { kIdentity = 0, kGelu = 1, kActivations = 2 };
enum Variant : int { kAVX2 = 0, kAVX512 = 1, kAVX512BF16 = 2, kAVX2Split = 3, kVariants = 4 };

struct Gemm {
  const float* x;         // [m, k]
  const void* w;          // packed panels (see above)
  const float* scale;     // [n] or null
  const float* bias;      // [n] or null
  float* y;               // [m, n]
  const uint16_t* xb;     // x rounded to BF16, [m, kpad] (kAVX512BF16 only; others null)
  int64_t m, n, k, kpad;  // kpad: k rounded up to even
  int wtype;
  uint64_t serial;        // unique per product: a thread's decoded panel is reused within one only
  int64_t threads = 0;    // threads that will run the tasks (0: not known): variants that cut by shape size tasks to it
  const float* residual = nullptr;  // [m, n] added last, or null
  int activation = kIdentity;
};

// A variant: its tile sizes and its task function (defined in kernels_<variant>.cpp, compiled
// for that instruction set; only called after the CPU was checked to have it).
struct Kernel {
  const char* name;
  int64_t nr;                       // output columns per panel
  int64_t pair;                     // consecutive k of one column stored together (2: BF16 pairs)
  int64_t mc;                       // rows per task
  bool bf16_x;                      // wants Gemm::xb
  void (*task)(const Gemm&, int64_t);
  void (*round_rows)(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t row_begin, int64_t row_end);
  int64_t (*count)(const Gemm&) = nullptr;  // tasks of a product, when the variant cuts by shape (else panels x mc rows)
};

extern const Kernel kernel_avx2;
extern const Kernel kernel_avx512;
extern const Kernel kernel_avx512bf16;
extern const Kernel kernel_avx2_split;  // AVX2's, panels staged as float32 (kernels_avx2.cpp)

// Whether this CPU runs 256-bit AVX operations as two 128-bit halves (kernels_avx2.cpp).
bool splits_256();

// The 256 E4M3FN codes decoded exactly (NaN codes decode to 0: quantize never writes them).
extern const float e4m3_to_f32[256];
extern const uint16_t e4m3_to_bf16[256];

// Elements of one packed panel, and of the whole packed matrix.
inline int64_t panel_elements(int64_t k, const Kernel& kern) { return (k + kern.pair - 1) / kern.pair * kern.pair * kern.nr; }
inline int64_t packed_elements(int64_t n, int64_t k, const Kernel& kern) {
  return (n + kern.nr - 1) / kern.nr * panel_elements(k, kern);
}

// E4M3 codes of row[i] * inverse for BF16 weights (AVX2: every variant's machine has it),
// and the scalar rule it follows: round to nearest even, saturate at 448.
void encode_e4m3_avx2(const uint16_t* row, int64_t k, float inverse, uint8_t* codes);
uint16_t max_magnitude_avx2(const uint16_t* row, int64_t k);
uint8_t encode_e4m3(float v);

// FLOP/s of `iterations` x 12 register-only 256-bit FMAs on the calling thread (AVX2's peak, measured).
double fma_peak_avx2(int64_t iterations);

inline int64_t panels(const Gemm& g, const Kernel& kern) { return (g.n + kern.nr - 1) / kern.nr; }
inline int64_t row_blocks(const Gemm& g, const Kernel& kern) { return (g.m + kern.mc - 1) / kern.mc; }
inline int64_t tasks(const Gemm& g, const Kernel& kern) {
  return kern.count ? kern.count(g) : panels(g, kern) * row_blocks(g, kern);
}

// Panels a task takes where a task stages its next panel beside the FMAs of the one before
// (the avx2 and avx512 kernels' E4M3 at one block of rows): up to `most`, so that a task's
// first panel, staged alone, is one of many, with the panels a thread runs (its tasks', as
// ONNX Runtime hands them out) as few as can be; of equal spans the wider.
inline int64_t widest_tasks(int64_t panels, int64_t threads, int64_t most) {
  int64_t best = 1, span = (panels + threads - 1) / threads;
  for (int64_t wide = most; wide > 1; --wide) {
    const int64_t tasks = (panels + wide - 1) / wide;
    const int64_t here = (tasks + threads - 1) / threads * wide;
    if (here < span || (here == span && wide > best)) best = wide, span = here;
  }
  return best;
}

// A thread's buffer for staged panels, kept from product to product and grown as needed.
struct Staging {
  void* data = nullptr;
  int64_t bytes = 0;
  ~Staging() { std::free(data); }
  void* fit(int64_t need) {  // room for `need` bytes (a multiple of 64)
    if (need > bytes) {
      std::free(data);
      data = std::aligned_alloc(64, size_t(need));
      if (data == nullptr) std::abort();  // a panel or two: some hundreds of KiB at most
      bytes = need;
    }
    return data;
  }
};

}  // namespace uform
