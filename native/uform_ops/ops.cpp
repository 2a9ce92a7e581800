// uform's op library: ONNX Runtime custom ops for matrix products over BF16 and E4M3
// weights, and the plain C functions the Python side calls through ctypes (quantization,
// the variants this CPU runs, a direct product for parity tests).
//
// Ops, domain "ai.uform" (the graph rewrite in uform/plugins/e4m3.py emits them):
//   MatMulBF16(X: float[..., k], W: uint16 BF16 bits, bias?: float[n]) -> float[..., n]
//   MatMulE4M3(X: float[..., k], W: uint8 E4M3FN codes, scale: float[n], bias?: float[n])
// each computing y = scale * (x @ W^T) + bias for the checkpoint's [n, k] matrix W, held
// packed for the kernels (uform_pack), with the attributes `variant` (0 avx2, 1 avx512,
// 2 avx512-bf16) naming the kernels and `n` the output width; and
//   Attention(qkv: float[B * T, 3 * W], shape: int64[2] = (B, T), mask?: float) -> float[B * T, W]
// multi-head attention of `heads` heads over a fused qkv projection, the additive mask
// [B, 1, 1, T] (padding) or [T, T] (causal), float32 throughout (AVX-512 F). A kernel whose instructions this CPU lacks is
// refused when the session is created, with a message; nothing runs an illegal instruction.
// Work runs on ONNX Runtime's intra-op thread pool (KernelContext_ParallelFor).
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "gemm.h"

#define UFORM_EXPORT extern "C" __attribute__((visibility("default")))

namespace uform {
namespace {

constexpr int kAbi = 2;  // bump when an exported signature or an op's contract changes
const char* const kDomain = "ai.uform";
std::atomic<uint64_t> serials{1};

const Kernel* const kernels[kVariants] = {&kernel_avx2, &kernel_avx512, &kernel_avx512bf16};

bool runnable(int variant) {
  __builtin_cpu_init();
  switch (variant) {
    case kAVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
    case kAVX512BF16:
      return runnable(kAVX512) && __builtin_cpu_supports("avx512bf16");
    default:
      return false;
  }
}

// -- E4M3 ----------------------------------------------------------------------------------

float decode_e4m3(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return 0.0f;  // NaN: never written by quantize
  const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

inline float widen(uint16_t bf16) {
  const uint32_t bits = uint32_t(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rows [begin, end) of w, one panel's at most, copied into their packed places: a blocked
// transpose, 32 consecutive k of each row (a cache line of a row) at a time.
void copy_bf16(const uint16_t* w, int64_t k, const Kernel& kern, uint16_t* out, int64_t begin, int64_t end) {
  const int64_t nr = kern.nr, step = 32;
  uint16_t* dst = out + begin / nr * panel_elements(k, kern);
  if (kern.pair == 1) {
    for (int64_t i0 = 0; i0 < k; i0 += step) {
      const int64_t i1 = std::min(k, i0 + step);
      for (int64_t r = begin; r < end; ++r)
        for (int64_t i = i0, c = r % nr; i < i1; ++i) dst[i * nr + c] = w[r * k + i];
    }
    return;
  }
  const int64_t pairs = k / 2;  // pair == 2: a BF16 pair moves as one 32-bit word
  for (int64_t p0 = 0; p0 < pairs; p0 += step / 2) {
    const int64_t p1 = std::min(pairs, p0 + step / 2);
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = w + r * k;
      const int64_t c = r % nr;
      for (int64_t p = p0; p < p1; ++p) std::memcpy(dst + (p * nr + c) * 2, row + 2 * p, 4);
    }
  }
  if (k & 1)
    for (int64_t r = begin; r < end; ++r) dst[(pairs * nr + r % nr) * 2] = w[r * k + k - 1];
}

// Rows [begin, end) of w (BF16 bits, [n, k]) written into `out` packed for `kern`, as BF16
// or quantized to E4M3 with a scale per row; answers -1, or the flat index of a weight that
// is NaN or infinite. `out` arrives zeroed (the padding stays zero).
int64_t pack_rows(const uint16_t* w, int64_t k, const Kernel& kern, int wtype, void* out, float* scale, int64_t begin,
                  int64_t end) {
  const int64_t size = panel_elements(k, kern), nr = kern.nr, pair = kern.pair;
  std::vector<uint8_t> codes(wtype == kE4M3 ? size_t(k) : 0);
  for (int64_t r = begin; r < end; ++r) {
    const uint16_t* row = w + r * k;
    const uint16_t top = max_magnitude_avx2(row, k);  // every variant's machine has AVX2
    if (top >= 0x7F80u) {
      for (int64_t i = 0; i < k; ++i)
        if ((row[i] & 0x7F80u) == 0x7F80u) return r * k + i;
    }
    const int64_t base = r / nr * size, c = r % nr;
    if (wtype == kBF16) continue;  // copied below, a panel at a time
    const float amax = widen(top);
    const float inverse = amax > 0.0f ? std::min(448.0f / amax, FLT_MAX) : 1.0f;  // a subnormal amax: no infinity
    scale[r] = amax > 0.0f ? amax / 448.0f : 1.0f;
    encode_e4m3_avx2(row, k, inverse, codes.data());
    uint8_t* dst = static_cast<uint8_t*>(out) + base;
    if (pair == 2) {
      for (int64_t p = 0; p < k / 2; ++p) std::memcpy(dst + (p * nr + c) * 2, codes.data() + 2 * p, 2);
      if (k & 1) dst[(k / 2 * nr + c) * 2] = codes[k - 1];
    } else {
      for (int64_t i = 0; i < k; ++i) dst[i * nr + c] = codes[i];
    }
  }
  if (wtype == kBF16) copy_bf16(w, k, kern, static_cast<uint16_t*>(out), begin, end);
  return -1;
}

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

// -- ONNX Runtime ops --------------------------------------------------------------------

struct OpKernel {
  const OrtApi* api;
  const Kernel* kern;
  int wtype;
  int64_t n;
  std::string name;
};

struct Parallel {
  const Gemm* g;
  const Kernel* kern;
  uint16_t* xb;
  int64_t rows_per_piece;
};

OrtStatus* fail(const OrtApi* api, const std::string& msg) { return api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

#define ORT_TRY(expr)                            \
  do {                                           \
    if (OrtStatus* status_ = (expr)) return status_; \
  } while (0)

OrtStatus* shape_of(const OrtApi* api, const OrtValue* value, std::vector<int64_t>& dims) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ORT_TRY(api->GetTensorTypeAndShape(value, &info));
  size_t count = 0;
  OrtStatus* status = api->GetDimensionsCount(info, &count);
  if (!status) {
    dims.resize(count);
    status = api->GetDimensions(info, dims.data(), count);
  }
  api->ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

OrtStatus* compute(OpKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  size_t inputs = 0;
  ORT_TRY(api->KernelContext_GetInputCount(ctx, &inputs));
  const bool e4m3 = op->wtype == kE4M3;
  const OrtValue *x = nullptr, *w = nullptr, *scale = nullptr, *bias = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, 0, &x));
  ORT_TRY(api->KernelContext_GetInput(ctx, 1, &w));
  if (e4m3) ORT_TRY(api->KernelContext_GetInput(ctx, 2, &scale));
  const size_t bias_at = e4m3 ? 3 : 2;
  if (inputs > bias_at) ORT_TRY(api->KernelContext_GetInput(ctx, bias_at, &bias));
  std::vector<int64_t> xd, wd, sd, bd;
  ORT_TRY(shape_of(api, x, xd));
  ORT_TRY(shape_of(api, w, wd));
  if (xd.empty() || xd.back() < 1) return fail(api, op->name + ": x must be [..., k] with k > 0");
  const int64_t n = op->n, k = xd.back();
  int64_t held = 1;
  for (int64_t d : wd) held *= d;
  if (held != packed_elements(n, k, *op->kern))
    return fail(api, op->name + ": w holds " + std::to_string(held) + " elements, not a [" + std::to_string(n) + ", " +
                         std::to_string(k) + "] matrix packed for the " + op->kern->name + " kernels");
  if (scale) {
    ORT_TRY(shape_of(api, scale, sd));
    if (sd.size() != 1 || sd[0] != n) return fail(api, op->name + ": scale must be [n]");
  }
  if (bias) {
    ORT_TRY(shape_of(api, bias, bd));
    if (bd.size() != 1 || bd[0] != n) return fail(api, op->name + ": bias must be [n]");
  }
  int64_t m = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  std::vector<int64_t> yd = xd;
  yd.back() = n;
  OrtValue* y = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, yd.data(), yd.size(), &y));
  if (m == 0 || n == 0) return nullptr;
  Gemm g{};
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(x), &data));
  g.x = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(w), &data));
  g.w = data;
  if (scale) {
    ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(scale), &data));
    g.scale = static_cast<const float*>(data);
  }
  if (bias) {
    ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(bias), &data));
    g.bias = static_cast<const float*>(data);
  }
  ORT_TRY(api->GetTensorMutableData(y, &data));
  g.y = static_cast<float*>(data);
  g.m = m, g.n = n, g.k = k, g.kpad = (k + 1) / 2 * 2, g.wtype = op->wtype;
  g.serial = serials++;
  const Kernel* kern = op->kern;
  std::vector<uint16_t> xb;
  Parallel par{&g, kern, nullptr, 64};
  if (kern->bf16_x) {
    xb.resize(size_t(m) * size_t(g.kpad));
    g.xb = xb.data();
    par.xb = xb.data();
    const int64_t pieces = (m + par.rows_per_piece - 1) / par.rows_per_piece;
    ORT_TRY(api->KernelContext_ParallelFor(
        ctx,
        [](void* p, size_t i) {
          auto* par = static_cast<Parallel*>(p);
          const int64_t begin = int64_t(i) * par->rows_per_piece;
          const int64_t end = std::min(par->g->m, begin + par->rows_per_piece);
          par->kern->round_rows(par->g->x, par->g->k, par->xb, par->g->kpad, begin, end);
        },
        size_t(pieces), 0, &par));
  }
  ORT_TRY(api->KernelContext_ParallelFor(
      ctx,
      [](void* p, size_t i) {
        auto* par = static_cast<Parallel*>(p);
        par->kern->task(*par->g, int64_t(i));
      },
      size_t(tasks(g, *kern)), 0, &par));
  return nullptr;
}

template <int WType>
struct Op : OrtCustomOp {
  Op() : OrtCustomOp{} {
    version = ORT_API_VERSION;
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      const std::string name = WType == kE4M3 ? "ai.uform.MatMulE4M3" : "ai.uform.MatMulBF16";
      int64_t variant = -1;
      if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "variant", &variant)) {
        api->ReleaseStatus(status);
        return fail(api, name + ": the attribute 'variant' is missing");
      }
      if (variant < 0 || variant >= kVariants) return fail(api, name + ": unknown variant " + std::to_string(variant));
      int64_t n = 0;
      if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "n", &n)) {
        api->ReleaseStatus(status);
        return fail(api, name + ": the attribute 'n' is missing");
      }
      if (n < 1) return fail(api, name + ": n must be positive");
      if (!runnable(int(variant)))
        return api->CreateStatus(ORT_NOT_IMPLEMENTED, (name + ": this CPU lacks the instructions of the " +
                                                       kernels[variant]->name + " kernels").c_str());
      auto* kernel = new (std::nothrow) OpKernel{api, kernels[variant], WType, n, name};
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      *out = kernel;
      return nullptr;
    };
    KernelComputeV2 = [](void* kernel, OrtKernelContext* ctx) -> OrtStatus* {
      auto* op = static_cast<OpKernel*>(kernel);
      try {
        return compute(op, ctx);
      } catch (const std::bad_alloc&) {
        return op->api->CreateStatus(ORT_FAIL, (op->name + ": out of memory").c_str());
      }
    };
    KernelDestroy = [](void* kernel) { delete static_cast<OpKernel*>(kernel); };
    GetName = [](const OrtCustomOp*) { return WType == kE4M3 ? "MatMulE4M3" : "MatMulBF16"; };
    GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return WType == kE4M3 ? 4 : 3; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      if (i == 1) return WType == kE4M3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
      const size_t bias = WType == kE4M3 ? 3 : 2;
      return i == bias ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
    };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetStartVersion = [](const OrtCustomOp*) { return 1; };
    GetEndVersion = [](const OrtCustomOp*) { return 1 << 30; };
  }
};

const Op<kBF16> matmul_bf16;
const Op<kE4M3> matmul_e4m3;

// -- Attention ----------------------------------------------------------------------------

struct AttentionKernel {
  const OrtApi* api;
  int64_t heads;
};

OrtStatus* attend(AttentionKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  const std::string name = "ai.uform.Attention";
  size_t inputs = 0;
  ORT_TRY(api->KernelContext_GetInputCount(ctx, &inputs));
  const OrtValue *qkv = nullptr, *shape = nullptr, *mask = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, 0, &qkv));
  ORT_TRY(api->KernelContext_GetInput(ctx, 1, &shape));
  if (inputs > 2) ORT_TRY(api->KernelContext_GetInput(ctx, 2, &mask));
  std::vector<int64_t> qd, sd, md;
  ORT_TRY(shape_of(api, qkv, qd));
  ORT_TRY(shape_of(api, shape, sd));
  if (sd.size() != 1 || sd[0] != 2) return fail(api, name + ": shape must be int64 [2] (items, tokens)");
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(shape), &data));
  const int64_t items = static_cast<const int64_t*>(data)[0], tokens = static_cast<const int64_t*>(data)[1];
  if (qd.size() != 2 || items < 0 || tokens < 0 || qd[0] != items * tokens || qd[1] % (3 * op->heads) != 0)
    return fail(api, name + ": qkv must be [items * tokens, 3 * heads * head_dim]");
  const int64_t width = qd[1] / 3, head_dim = width / op->heads;
  if (head_dim % 16 != 0) return fail(api, name + ": head_dim must be a multiple of 16");
  Attention a{};
  if (mask) {
    ORT_TRY(shape_of(api, mask, md));
    const bool padding = md.size() == 4 && md[0] == items && md[1] == 1 && md[2] == 1 && md[3] == tokens;
    const bool causal = md.size() == 2 && md[0] == tokens && md[1] == tokens;
    if (!padding && !causal) return fail(api, name + ": mask must be [items, 1, 1, tokens] or [tokens, tokens]");
    ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(mask), &data));
    a.mask = static_cast<const float*>(data);
    a.mask_per_query = causal;
  }
  const int64_t dims[2] = {items * tokens, width};
  OrtValue* out = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, dims, 2, &out));
  if (items * tokens == 0) return nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(qkv), &data));
  a.qkv = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(out, &data));
  a.out = static_cast<float*>(data);
  a.items = items, a.tokens = tokens, a.heads = op->heads, a.head_dim = head_dim;
  return api->KernelContext_ParallelFor(
      ctx, [](void* p, size_t i) { attention_task(*static_cast<const Attention*>(p), int64_t(i)); },
      size_t(items * op->heads), 0, &a);
}

struct AttentionOp : OrtCustomOp {
  AttentionOp() : OrtCustomOp{} {
    version = ORT_API_VERSION;
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      int64_t heads = 0;
      if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "heads", &heads)) {
        api->ReleaseStatus(status);
        return fail(api, "ai.uform.Attention: the attribute 'heads' is missing");
      }
      if (heads < 1) return fail(api, "ai.uform.Attention: heads must be positive");
      if (!runnable(kAVX512))
        return api->CreateStatus(ORT_NOT_IMPLEMENTED, "ai.uform.Attention: this CPU lacks AVX-512");
      auto* kernel = new (std::nothrow) AttentionKernel{api, heads};
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      *out = kernel;
      return nullptr;
    };
    KernelComputeV2 = [](void* kernel, OrtKernelContext* ctx) -> OrtStatus* {
      auto* op = static_cast<AttentionKernel*>(kernel);
      try {
        return attend(op, ctx);
      } catch (const std::bad_alloc&) {
        return op->api->CreateStatus(ORT_FAIL, "ai.uform.Attention: out of memory");
      }
    };
    KernelDestroy = [](void* kernel) { delete static_cast<AttentionKernel*>(kernel); };
    GetName = [](const OrtCustomOp*) { return "Attention"; };
    GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) { return i == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED; };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetStartVersion = [](const OrtCustomOp*) { return 1; };
    GetEndVersion = [](const OrtCustomOp*) { return 1 << 30; };
  }
};

const AttentionOp attention_op;

}  // namespace

// Round to nearest even, saturating at ±448 (E4M3FN has no infinity). Branch-free so that
// a row's codes vectorize: normal magnitudes keep 3 mantissa bits and rebias the exponent
// from 127 to 7; below 2^-6 the codes count multiples of 2^-9.
uint8_t encode_e4m3(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t sign = (bits >> 24) & 0x80u;
  bits &= 0x7FFFFFFFu;
  float a;
  std::memcpy(&a, &bits, 4);
  const uint32_t rounded = bits + 0x7FFFFu + ((bits >> 20) & 1u);
  const uint32_t normal = std::min<uint32_t>((rounded >> 20) - std::min<uint32_t>(rounded >> 20, 120u << 3), 0x7Eu);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds [0, 2^22) to an integer, ties to even
  const uint32_t subnormal = uint32_t((std::min(a, 1.0f) * 512.0f + magic) - magic);
  return uint8_t(sign | (a < 0.015625f ? subnormal : normal));
}

const float e4m3_to_f32[256] = {
#define D(i) decode_e4m3(uint8_t(i))
#define D8(i) D(i), D(i + 1), D(i + 2), D(i + 3), D(i + 4), D(i + 5), D(i + 6), D(i + 7)
#define D64(i) D8(i), D8(i + 8), D8(i + 16), D8(i + 24), D8(i + 32), D8(i + 40), D8(i + 48), D8(i + 56)
    D64(0), D64(64), D64(128), D64(192)};

const uint16_t e4m3_to_bf16[256] = {
#define B(i) uint16_t([] (float f) { uint32_t b; std::memcpy(&b, &f, 4); return b >> 16; }(decode_e4m3(uint8_t(i))))
#define B8(i) B(i), B(i + 1), B(i + 2), B(i + 3), B(i + 4), B(i + 5), B(i + 6), B(i + 7)
#define B64(i) B8(i), B8(i + 8), B8(i + 16), B8(i + 24), B8(i + 32), B8(i + 40), B8(i + 48), B8(i + 56)
    B64(0), B64(64), B64(128), B64(192)};

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
// w packed by uform_pack for the same variant.
// Answers 0, 1 when this CPU cannot run `variant`, 2 for bad arguments, 3 out of memory.
UFORM_EXPORT int uform_gemm(int variant, const float* x, int64_t m, int64_t k, const void* w, int wtype, int64_t n,
                            const float* scale, const float* bias, float* y, int threads) {
  if (variant < 0 || variant >= kVariants || !runnable(variant)) return 1;
  if (m < 0 || n < 0 || k <= 0 || (wtype != kBF16 && wtype != kE4M3)) return 2;
  if (m == 0 || n == 0) return 0;
  const Kernel& kern = *kernels[variant];
  Gemm g{x, w, scale, bias, y, nullptr, m, n, k, (k + 1) / 2 * 2, wtype, serials++};
  std::vector<uint16_t> xb;
  try {
    if (kern.bf16_x) xb.resize(size_t(m) * size_t(g.kpad));
  } catch (const std::bad_alloc&) {
    return 3;
  }
  if (kern.bf16_x) {
    g.xb = xb.data();
    spread((m + 63) / 64, threads, [&](int64_t i) { kern.round_rows(x, k, xb.data(), g.kpad, i * 64, std::min(m, (i + 1) * 64)); });
  }
  spread(tasks(g, kern), threads, [&](int64_t t) { kern.task(g, t); });
  return 0;
}

// Attention outside ONNX Runtime (for parity tests): answers 0, 1 without AVX-512, 2 for bad arguments.
UFORM_EXPORT int uform_attention(const float* qkv, const float* mask, int mask_per_query, float* out, int64_t items,
                                 int64_t tokens, int64_t heads, int64_t head_dim, int threads) {
  if (!runnable(kAVX512)) return 1;
  if (items < 0 || tokens < 0 || heads < 1 || head_dim < 16 || head_dim % 16) return 2;
  const Attention a{qkv, mask, mask_per_query != 0, out, items, tokens, heads, head_dim, 0};
  spread(items * heads, threads, [&](int64_t t) { attention_task(a, t); });
  return 0;
}

UFORM_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api) return nullptr;  // an ONNX Runtime older than the headers: the Python side refuses it first
  static std::mutex lock;
  static std::vector<OrtCustomOpDomain*> domains;  // alive as long as any session may use them
  std::lock_guard<std::mutex> hold(lock);
  OrtCustomOpDomain* domain = nullptr;
  ORT_TRY(api->CreateCustomOpDomain(kDomain, &domain));
  domains.push_back(domain);
  ORT_TRY(api->CustomOpDomain_Add(domain, &matmul_bf16));
  ORT_TRY(api->CustomOpDomain_Add(domain, &matmul_e4m3));
  ORT_TRY(api->CustomOpDomain_Add(domain, &attention_op));
  return api->AddCustomOpDomain(options, domain);
}
