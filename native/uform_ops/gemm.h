// The matrix product every kernel variant computes, and what the variants export.
//
//   y[m, n] = act(scale[n] * sum_k x[m, k] * w[n, k] + bias[n]) + residual[m, n]
//
// act is the identity, GELU (exact or tanh's) or quick GELU (gelu.inc) and residual an optional [m, n] float32 matrix:
// a block's fc1 and GELU, or a projection and the residual add after it, in one pass over y.
// x is float32 [m, k] (row stride k); w holds the checkpoint's [n, k] matrix as raw bits,
// BF16 (uint16) or FLOAT8 E4M3FN (uint8), packed at load for the variant (pack.cpp): panels
// of `nr` output columns, each [k / pair][nr][pair] with pair = 2 for avx512-bf16, amx, avx2 and
// avx2-split and 1 for avx512, zero-padded past n and k (k to a multiple of the kernel's kblock:
// its pair, or a tile's 32 values for amx). scale (E4M3's per-output-channel scale) and
// bias may be null. Work is cut into tasks (panels of output columns times a block of rows, or
// spans of panels handed out as they are run: PanelSpans) that any thread may run in any
// order: each panel writes its own part of y only, its bits whichever thread runs it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "staging.h"

namespace uform {

enum WeightType : int { kBF16 = 0, kE4M3 = 1 };
// GELU exact (erf), as tanh's approximation (ONNX's Gelu approximate="tanh"), and quick GELU x * sigmoid(1.702 x)
enum Activation : int { kIdentity = 0, kGelu = 1, kGeluTanh = 2, kQuickGelu = 3, kActivations = 4 };
// kAMXModel: the amx kernels over a scalar model of the tile instructions, built for every
// machine (tests and the tiling's edges; no load takes it).
enum Variant : int { kAVX2 = 0, kAVX512 = 1, kAVX512BF16 = 2, kAVX2Split = 3, kAMX = 4, kAMXModel = 5, kVariants = 6 };

struct Gemm {
  const float* x;         // [m, k]
  const void* w;          // packed panels (see above)
  const float* scale;     // [n] or null
  const float* bias;      // [n] or null
  float* y;               // [m, n]
  const uint16_t* xb;     // x rounded to BF16, [m, kpad] and kXRowsPad rows more (bf16_x variants, in the
                          // variant's layout: amx's in blocks of 16 rows, tiles.inc; others null)
  int64_t m, n, k, kpad;  // kpad: k_padded(k, kernel)
  int wtype;
  uint64_t serial;        // unique per product: a thread's decoded panel is reused within one only
  int64_t threads = 0;    // threads that will run the tasks (0: not known): variants that cut by shape size tasks to it
  const float* residual = nullptr;  // [m, n] added last, or null
  int activation = kIdentity;
  struct Claim* claims = nullptr;  // kMaxClaims zeroed words (Claims) for the tasks that hand out panels (PanelSpans)
  // Where set (bf16_x variants, n a multiple of a tile's 32 values), y goes to the next product
  // instead: act(...) + residual rounded to BF16 as round_rows rounds x, in Gemm::xb's layout for
  // an x of k = n ([m + kXRowsPad, n] elements; the padding rows not written); y is not used.
  uint16_t* yb = nullptr;
  // Whether the kernels may write y past the caches where it is larger than they are (amx's
  // tiles.inc, from kStreamBytes); false keeps every store a plain one (the op's `stream` = 0).
  bool stream = true;
};

constexpr int64_t kMaxClaims = 64;  // tasks of a product that may hand out its panels as they go (Gemm::claims)

// A claim word on a cache line of its own (threads taking panels from different spans do not
// take the line from each other).
struct alignas(64) Claim {
  std::atomic<uint64_t> word;
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
  int64_t kblock = 0;  // k of a panel and of Gemm::xb's rows padded to a multiple of it (0: pair)
};

constexpr int64_t kXRowsPad = 16;  // rows of Gemm::xb past m that may be read (a tile's 16 rows; never used)

extern const Kernel kernel_avx2;
extern const Kernel kernel_avx512;
extern const Kernel kernel_avx512bf16;
extern const Kernel kernel_avx2_split;  // AVX2's, panels staged as float32 (kernels_avx2.cpp)
extern const Kernel kernel_amx;         // AMX tiles (kernels_amx.cpp)
extern const Kernel kernel_amx_model;   // the same over a scalar model of the tiles (kernels_amx_model.cpp)

// Why this process cannot run tile instructions (no AMX-BF16, no tile state in XCR0, the
// kernel refused ARCH_REQ_XCOMP_PERM), or null when it can; asks for the permission once.
const char* amx_refusal();

// The AVX-512 BF16 pieces the amx kernels share with avx512-bf16 (kernels_avx512bf16.cpp):
// `count` E4M3 codes (a multiple of 32) to BF16 bits, and rows of x rounded to BF16 (zeros from
// k to kpad).
void decode_e4m3_bf16_avx512(const uint8_t* src, uint16_t* dst, int64_t count);
void round_rows_avx512bf16(const float* x, int64_t k, uint16_t* xb, int64_t kpad, int64_t begin, int64_t end);

// Whether this CPU runs 256-bit AVX operations as two 128-bit halves (kernels_avx2.cpp).
bool splits_256();

// The 256 E4M3FN codes decoded exactly (NaN codes decode to 0: quantize never writes them).
extern const float e4m3_to_f32[256];
extern const uint16_t e4m3_to_bf16[256];

// k padded as a panel holds it, and as Gemm::kpad (at least even) and x's BF16 rows.
inline int64_t panel_depth(int64_t k, const Kernel& kern) {
  const int64_t block = kern.kblock ? kern.kblock : kern.pair;
  return (k + block - 1) / block * block;
}
inline int64_t k_padded(int64_t k, const Kernel& kern) { return (panel_depth(k, kern) + 1) / 2 * 2; }
// Whether y of `n` columns may be handed to the next product as BF16 (Gemm::yb): a bf16_x
// variant, n its own padded width (a multiple of 32 serves every variant).
inline bool hands_bf16(int64_t n, const Kernel& kern) { return kern.bf16_x && n > 0 && k_padded(n, kern) == n; }

// Elements of one packed panel, and of the whole packed matrix.
inline int64_t panel_elements(int64_t k, const Kernel& kern) { return panel_depth(k, kern) * kern.nr; }
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
// FLOP/s of `iterations` x 4 register-only TDPBF16PS on the calling thread (AMX's peak; only
// where amx_refusal() is null).
double tile_peak_amx(int64_t iterations);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t panels(const Gemm& g, const Kernel& kern) { return (g.n + kern.nr - 1) / kern.nr; }
inline int64_t row_blocks(const Gemm& g, const Kernel& kern) { return (g.m + kern.mc - 1) / kern.mc; }
inline int64_t tasks(const Gemm& g, const Kernel& kern) {
  return kern.count ? kern.count(g) : panels(g, kern) * row_blocks(g, kern);
}

// Panels handed out as they are run, by the tasks of a product that cut it into `spans` (at
// most kMaxClaims, with Gemm::claims a word each): task s owns the panels [s * panels / spans,
// (s + 1) * panels / spans) and takes them from the front, one at a time; a task whose own are
// gone takes the others' from their backs, so that no thread waits while another has two
// panels left (fixed tasks of 12-16 panels left the first done waiting 11-18 us a product at 13
// rows). A claim word counts the panels taken from its span's front (low 32 bits) and back.
struct PanelSpans {
  Claim* words;
  int64_t spans, panels;

  int64_t begin(int64_t s) const { return s * panels / spans; }
  int64_t end(int64_t s) const { return (s + 1) * panels / spans; }
  // A panel of span s not yet taken (its first, or with `back` its last), or -1 when none is left.
  int64_t take(int64_t s, bool back) const {
    uint64_t w = words[s].word.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = int64_t(w & 0xFFFFFFFFu), behind = int64_t(w >> 32);
      if (begin(s) + front >= end(s) - behind) return -1;
      // relaxed: the words only share out the panels; the pool's join orders the writes to y
      if (words[s].word.compare_exchange_weak(w, back ? w + (uint64_t(1) << 32) : w + 1, std::memory_order_relaxed))
        return back ? end(s) - behind - 1 : begin(s) + front;
    }
  }
};

// What one task takes in turn: its own span's panels front to back, then the other spans'
// from their backs, one span at a time (each read as one stream, backwards).
struct PanelWalk {
  const PanelSpans& spans;
  int64_t own, from = -1;  // from: the span taken from the back (-1: still the task's own front)

  int64_t next() {
    if (from < 0) {
      if (const int64_t j = spans.take(own, false); j >= 0) return j;
      from = own;
    }
    for (int64_t i = 0; i < spans.spans; ++i) {
      const int64_t s = (from + i) % spans.spans;
      if (const int64_t j = spans.take(s, true); j >= 0) {
        from = s;
        return j;
      }
    }
    return -1;
  }
};

// Zeroed claim words for one product (Gemm::claims), on the caller's stack: every caller of
// Kernel::task gives them.
struct Claims {
  Claim words[kMaxClaims];
  Claims() {
    for (auto& w : words) w.word.store(0, std::memory_order_relaxed);
  }
};

// Which panel each slot of a thread's decoded panels holds: the product (Gemm::serial) and the
// panel, in plain memory (not a std::vector: staging.h says why).
struct Slots {
  struct Mark {
    uint64_t serial;
    int64_t panel;
  };
  Mark* marks = nullptr;
  size_t count = 0;
  ~Slots() { std::free(marks); }
  Slots() = default;
  Slots(const Slots&) = delete;
  Slots& operator=(const Slots&) = delete;
  void forget() {  // every slot holds nothing
    for (size_t i = 0; i < count; ++i) marks[i] = Mark{~uint64_t(0), -1};
  }
  void fit(size_t n) {  // room for n slots (those added, and all where it grows, hold nothing)
    if (n <= count) return;
    std::free(marks);
    marks = static_cast<Mark*>(std::malloc(n * sizeof(Mark)));
    if (marks == nullptr) std::abort();  // a few slots a panel: nothing sensible is left to do
    count = n;
    forget();
  }
  bool holds(size_t slot, uint64_t serial, int64_t panel) const {
    return slot < count && marks[slot].serial == serial && marks[slot].panel == panel;
  }
  void hold(size_t slot, uint64_t serial, int64_t panel) { marks[slot] = Mark{serial, panel}; }
};

}  // namespace uform
