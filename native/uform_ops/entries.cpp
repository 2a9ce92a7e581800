// The library's plain C entries, for ctypes: its ABI, the variants this CPU runs, packing,
// and the products outside ONNX Runtime (parity tests and benchmarks).
#include <cstdlib>
#include <new>

#include "attention.h"
#include "library.h"

namespace uform {

constexpr int kAbi = 11;  // bump when an exported signature or an op's contract changes
const Kernel* const kernels[kVariants] = {&kernel_avx2,       &kernel_avx512, &kernel_avx512bf16,
                                          &kernel_avx2_split, &kernel_amx,    &kernel_amx_model};

namespace {
std::atomic<uint64_t> serials{1};
}  // namespace

uint64_t next_serial() { return serials++; }

void* thread_scratch(Scratch which, size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[kScratches];
  Buffer& buffer = buffers[which];
  if (buffer.size < bytes) {
    std::free(buffer.data);
    buffer.size = 0;
    buffer.data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (buffer.data == nullptr) throw std::bad_alloc();  // callers report it
    buffer.size = bytes;
  }
  return buffer.data;
}

uint16_t* rounded_x(size_t elements) {
  // page-aligned: an A tile's rows are whole lines (a vector's 16-byte alignment split every row
  // of every tile load across two lines: 1.07x with the lines whole, amx at 5,568 rows)
  return static_cast<uint16_t*>(thread_scratch(kRoundedX, elements * sizeof(uint16_t)));
}

bool runnable(int variant) {
  __builtin_cpu_init();
  switch (variant) {
    case kAVX2:
    case kAVX2Split:  // runs anywhere AVX2 does; chosen where 256-bit operations are split (splits_256)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
    case kAVX512BF16:
      return runnable(kAVX512) && __builtin_cpu_supports("avx512bf16");
    case kAMX:  // asks Linux for the tile state the first time
      return runnable(kAVX512BF16) && amx_refusal() == nullptr;
    case kAMXModel:  // the model's own code is plain C++; packing (pack.cpp) takes AVX2
      return runnable(kAVX2);
    default:
      return false;
  }
}

// amx: the tiles, only where they are granted; amx-model: the tile model, anywhere AVX2 runs;
// avx512-bf16: AVX-512's scores and BF16 values; avx512: AVX-512's float32; avx2 and
// avx2-split: AVX2's.
AttentionTasks attention_kernel(int variant) {
  if (variant == kAMX) return attention_tasks_amx;
  if (variant == kAMXModel) return attention_tasks_amx_model;
  if (variant == kAVX512BF16) return attention_tasks_bf16;
  return wide_attention(variant) ? attention_tasks : attention_tasks_avx2;
}

int attention_needs(int variant) {
  if (variant == kAMX || variant == kAMXModel || variant == kAVX512BF16) return variant;
  return wide_attention(variant) ? kAVX512 : kAVX2;
}

}  // namespace uform

using namespace uform;

UFORM_EXPORT int uform_ops_abi() { return kAbi; }

UFORM_EXPORT const char* uform_ops_variant_name(int variant) {
  return variant >= 0 && variant < kVariants ? kernels[variant]->name : nullptr;
}

// Bit v set when this CPU runs variant v.
UFORM_EXPORT unsigned uform_ops_runnable() {
  unsigned mask = 0;
  for (int v = 0; v < kVariants; ++v)
    if (runnable(v)) mask |= 1u << v;
  return mask;
}

// Why this process cannot run the amx kernels, or null when it can.
UFORM_EXPORT const char* uform_ops_amx_refusal() { return amx_refusal(); }

// The CPU's vendor: 1 Intel, 2 AMD, 0 another (each class's variant is chosen by measurement
// on its vendor's cores: uform/plugins/e4m3.py).
UFORM_EXPORT int uform_ops_cpu_vendor() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") ? 1 : __builtin_cpu_is("amd") ? 2 : 0;
}

// The calling thread's modelled tile configuration (the amx-model variant), 64 bytes: copied
// to `out`, then set from `in`, each where not null (tests).
UFORM_EXPORT void uform_amx_model_config(uint8_t* out, const uint8_t* in) { amx_model_config(out, in); }

// 1 when this CPU runs 256-bit AVX operations as two 128-bit halves (the avx2-split
// variant's machines), else 0.
UFORM_EXPORT int uform_ops_splits_256() { return splits_256() ? 1 : 0; }

// Elements (uint16 for BF16, bytes for E4M3) of an [n, k] matrix packed for `variant`.
UFORM_EXPORT int64_t uform_packed_elements(int variant, int64_t n, int64_t k) {
  return variant >= 0 && variant < kVariants && n > 0 && k > 0 ? packed_elements(n, k, *kernels[variant]) : -1;
}

// w: BF16 bits [n, k] -> out (zeroed, uform_packed_elements long) packed for `variant`, as
// BF16 or as E4M3FN codes with scale[n] (w ~ code * scale, per output channel). Answers -1,
// -2 for bad arguments, -3 when this CPU cannot run `variant`, or the flat index of a weight that is NaN or infinite (out is then
// partly written).
UFORM_EXPORT int64_t uform_pack(int variant, int wtype, const uint16_t* w, int64_t n, int64_t k, void* out, float* scale,
                                int threads) {
  if (variant < 0 || variant >= kVariants || n <= 0 || k <= 0 || (wtype != kBF16 && wtype != kE4M3)) return -2;
  if (wtype == kE4M3 && scale == nullptr) return -2;
  if (!runnable(variant)) return -3;
  const Kernel& kern = *kernels[variant];
  const int64_t pieces = (n + kern.nr - 1) / kern.nr;  // a panel each: no two threads share a cache line
  std::atomic<int64_t> bad{-1};
  spread(pieces, threads, [&](int64_t i) {
    const int64_t found = pack_rows(w, k, kern, wtype, out, scale, i * kern.nr, std::min(n, (i + 1) * kern.nr));
    int64_t none = -1;
    if (found >= 0) bad.compare_exchange_strong(none, found);
  });
  return bad.load();
}

// The product outside ONNX Runtime (for parity tests and benchmarks of the kernels alone);
// w packed by uform_pack for the same variant; residual ([m, n]) may be null, activation is
// 0 (none), 1 (GELU), 2 (tanh GELU) or 3 (quick GELU).
// Answers 0, 1 when this CPU cannot run `variant`, 2 for bad arguments, 3 out of memory.
UFORM_EXPORT int uform_gemm(int variant, const float* x, int64_t m, int64_t k, const void* w, int wtype, int64_t n,
                            const float* scale, const float* bias, const float* residual, int activation, float* y,
                            int threads) {
  if (variant < 0 || variant >= kVariants || !runnable(variant)) return 1;
  if (m < 0 || n < 0 || k <= 0 || (wtype != kBF16 && wtype != kE4M3)) return 2;
  if (activation < 0 || activation >= kActivations) return 2;
  if (m == 0 || n == 0) return 0;
  const Kernel& kern = *kernels[variant];
  Gemm g{x, w, scale, bias, y, nullptr, m, n, k, k_padded(k, kern), wtype, next_serial(), threads, residual, activation};
  if (kern.bf16_x) {
    uint16_t* xb = nullptr;
    try {
      xb = rounded_x(size_t(m + kXRowsPad) * size_t(g.kpad));
    } catch (const std::bad_alloc&) {
      return 3;
    }
    g.xb = xb;
    spread((m + 63) / 64, threads, [&](int64_t i) { kern.round_rows(x, k, xb, g.kpad, i * 64, std::min(m, (i + 1) * 64)); });
  }
  Claims claims;
  g.claims = claims.words;
  spread(tasks(g, kern), threads, [&](int64_t t) { kern.task(g, t); });
  return 0;
}

// The peak of `variant` on `threads` threads at once, in FLOP/s (for benchmarks: the share of
// it a product reaches): AVX2's FMA chains, AMX's TDPBF16PS chains; answers -1 for a variant
// that has no probe or that this CPU cannot run.
UFORM_EXPORT double uform_fma_peak(int variant, int threads) {
  if ((variant != kAVX2 && variant != kAVX2Split && variant != kAMX) || !runnable(variant) || threads < 1) return -1;
  const bool tiles = variant == kAMX;
  const int64_t iterations = tiles ? int64_t(1) << 20 : int64_t(1) << 24;  // ~0.1 s a thread
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    std::vector<double> rates(size_t(threads), 0.0);
    spread(threads, threads, [&](int64_t t) { rates[size_t(t)] = tiles ? tile_peak_amx(iterations) : fma_peak_avx2(iterations); });
    double total = 0;
    for (double r : rates) total += r;
    best = std::max(best, total);
  }
  return best;
}

// Attention outside ONNX Runtime (for parity tests) through `variant`'s kernel (attention_kernel):
// answers 0, 1 for a variant this CPU cannot run, 2 for bad arguments.
UFORM_EXPORT int uform_attention(int variant, const float* qkv, const float* mask, int mask_per_query, float* out,
                                 int64_t items, int64_t tokens, int64_t heads, int64_t head_dim, int threads) {
  if (variant < 0 || variant >= kVariants) return 1;
  if (!runnable(attention_needs(variant))) return 1;
  if (items < 0 || tokens < 0 || heads < 1 || head_dim < 16 || head_dim % 16) return 2;
  const Attention a{qkv, mask, mask_per_query != 0, out, items, tokens, heads, head_dim, 0};
  const AttentionTasks run = attention_kernel(variant);
  const int64_t tasks = items * heads, chunk = attention_chunk(tokens, tasks);
  spread((tasks + chunk - 1) / chunk, threads, [&](int64_t c) { run(a, c * chunk, std::min(tasks, (c + 1) * chunk)); });
  return 0;
}

