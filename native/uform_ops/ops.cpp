// uform's op library as ONNX Runtime sees it: the custom ops for matrix products over BF16
// and E4M3 weights and for attention, and RegisterCustomOps. (entries.cpp holds the plain C
// functions the Python side calls through ctypes; pack.cpp the packing and quantization.)
//
// Ops, domain "ai.uform" (the graph rewrite in uform/plugins/e4m3.py emits them):
//   MatMulBF16(X: float[..., k], W: uint16 BF16 bits, bias?: float[n], residual?: float[..., n]) -> float[..., n]
//   MatMulE4M3(X: float[..., k], W: uint8 E4M3FN codes, scale: float[n], bias?: float[n], residual?: float[..., n])
// each computing y = act(scale * (x @ W^T) + bias) + residual for the checkpoint's [n, k]
// matrix W, held packed for the kernels (uform_pack), with the attributes `variant` (0 avx2,
// 1 avx512, 2 avx512-bf16, 3 avx2-split, 4 amx, 5 amx-model) naming the kernels, `n` the output width and,
// optionally, `threads` the session's intra-op threads (variants that cut a product by its
// shape size tasks to it) and `activation` (0 or absent: none; 1: GELU, exact; 2: GELU,
// tanh's approximation; 3: quick GELU, x * sigmoid(1.702 x));
//   MatMulBF16Handoff, MatMulE4M3Handoff: the same, with y handed to the one product that reads it
// as its x, rounded to BF16 as that product would round it and laid out as its kernels read x
// (Gemm::yb): uint16 [m + 16, n] for m rows (16 rows of padding the kernels may read), for the
// variants whose products read x as BF16 (avx512-bf16, amx, amx-model) with n a multiple of 32.
// The product reading it takes that as X, with the attribute `k` (= the handing product's n):
// one pass over memory instead of a float32 y written, read, rounded, written again and read,
// and the same bits. Every product's X is either;
//   LayerNormHandoff(X: float[..., d], scale: float[d], bias: float[d]) -> uint16 [m + 16, d]
// a layer norm over the last axis (attribute `epsilon`) handed to the one product that reads it,
// the same way (attribute `variant`, d a multiple of 32);
//   AttentionHandoff: Attention (below) with its context handed over the same way, uint16
// [B * T + 16, W] (W a multiple of 32); and
//   Attention(qkv: float[B * T, 3 * W], shape: int64[2] = (B, T), mask?: float) -> float[B * T, W]
// multi-head attention of `heads` heads over a fused qkv projection, the additive mask
// [B, 1, 1, T] (padding) or [T, T] (causal), float32 throughout, with the optional attribute
// `variant` (0 and 3: AVX2 with FMA; 1: AVX-512 F; 2: AVX-512 F scores and AVX-512 BF16 values; 4 and 5: BF16
// tiles and their model; absent: AVX-512 F where the CPU has it). A kernel whose
// instructions this CPU lacks is refused when the session is created, with a message;
// nothing runs an illegal instruction. (The QKVAttention ops, a block's qkv projection and its
// attention as one, are qkv_attention.cpp's; ops.h holds what they share with these.)
// Work runs on ONNX Runtime's intra-op thread pool (KernelContext_ParallelFor).
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "ops.h"

namespace uform {

OrtStatus* fail(const OrtApi* api, const std::string& msg) { return api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

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

namespace {

const char* const kDomain = "ai.uform";

struct Parallel {
  const Gemm* g;
  const Kernel* kern;
  uint16_t* xb;
  int64_t rows_per_piece;
};

// Whether `value` holds BF16 bits handed over (uint16), not float32 (any other type is refused).
OrtStatus* element_type(const OrtApi* api, const std::string& name, const OrtValue* value, bool& bf16) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ORT_TRY(api->GetTensorTypeAndShape(value, &info));
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  OrtStatus* status = api->GetTensorElementType(info, &type);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (status) return status;
  bf16 = type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
  if (!bf16 && type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
    return fail(api, name + ": x must be float32, or uint16 BF16 bits handed over by a ...Handoff product");
  return nullptr;
}

}  // namespace

OrtStatus* product_inputs(const OpKernel* op, OrtKernelContext* ctx, size_t scale_at, size_t bias_at, Gemm& g, bool& handed,
                          std::vector<int64_t>& xd) {
  const OrtApi* api = op->api;
  size_t inputs = 0;
  ORT_TRY(api->KernelContext_GetInputCount(ctx, &inputs));
  const bool e4m3 = op->wtype == kE4M3;
  const OrtValue *x = nullptr, *w = nullptr, *scale = nullptr, *bias = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, 0, &x));
  ORT_TRY(api->KernelContext_GetInput(ctx, 1, &w));
  if (e4m3) ORT_TRY(api->KernelContext_GetInput(ctx, scale_at, &scale));
  if (inputs > bias_at) ORT_TRY(api->KernelContext_GetInput(ctx, bias_at, &bias));  // null when the node names none ("")
  std::vector<int64_t> wd, sd, bd;
  ORT_TRY(shape_of(api, x, xd));
  ORT_TRY(shape_of(api, w, wd));
  handed = false;
  ORT_TRY(element_type(api, op->name, x, handed));
  const Kernel* kern = op->kern;
  if (handed) {
    if (!hands_bf16(op->k, *kern))
      return fail(api, op->name + ": x handed over as BF16 needs the attribute k (a multiple of 32) and a variant whose products read x as BF16, not " + kern->name);
    if (xd.size() != 2 || xd[0] < kXRowsPad || xd[1] != op->k)
      return fail(api, op->name + ": x handed over as BF16 must be [m + " + std::to_string(kXRowsPad) + ", k] with k = " + std::to_string(op->k));
  } else if (xd.empty() || xd.back() < 1) {
    return fail(api, op->name + ": x must be [..., k] with k > 0");
  }
  const int64_t n = op->n, k = handed ? op->k : xd.back();
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
  int64_t m = handed ? xd[0] - kXRowsPad : 1;
  for (size_t i = 0; !handed && i + 1 < xd.size(); ++i) m *= xd[i];
  g = Gemm{};
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(x), &data));
  if (handed)
    g.xb = static_cast<const uint16_t*>(data);
  else
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
  g.activation = op->activation;
  g.m = m, g.n = n, g.k = k, g.kpad = k_padded(k, *kern), g.wtype = op->wtype;
  g.threads = op->threads;
  g.stream = op->stream;
  g.serial = next_serial();  // one a call: a thread's decoded panel serves every run of g's tasks in it
  return nullptr;
}

OrtStatus* round_x(const OpKernel* op, OrtKernelContext* ctx, Gemm& g) {
  const Kernel* kern = op->kern;
  if (!kern->bf16_x || g.xb != nullptr || g.m == 0) return nullptr;
  Parallel par{&g, kern, nullptr, 64};
  par.xb = rounded_x(size_t(g.m + kXRowsPad) * size_t(g.kpad));  // the calling thread's: concurrent runs each have their own
  const int64_t pieces = (g.m + par.rows_per_piece - 1) / par.rows_per_piece;
  ORT_TRY(op->api->KernelContext_ParallelFor(
      ctx,
      [](void* p, size_t i) {
        auto* par = static_cast<Parallel*>(p);
        const int64_t begin = int64_t(i) * par->rows_per_piece;
        const int64_t end = std::min(par->g->m, begin + par->rows_per_piece);
        par->kern->round_rows(par->g->x, par->g->k, par->xb, par->g->kpad, begin, end);
      },
      size_t(pieces), 0, &par));
  g.xb = par.xb;
  return nullptr;
}

OrtStatus* product_tasks(const OpKernel* op, OrtKernelContext* ctx, Gemm& g) {
  if (g.m == 0 || g.n == 0) return nullptr;
  Parallel par{&g, op->kern, nullptr, 64};
  Claims claims;
  g.claims = claims.words;
  const int64_t count = tasks(g, *op->kern);
  return op->api->KernelContext_ParallelFor(
      ctx,
      [](void* p, size_t i) {
        auto* par = static_cast<Parallel*>(p);
        par->kern->task(*par->g, int64_t(i));
      },
      size_t(count), 0, &par);
}

OrtStatus* product_attributes(const OrtApi* api, const OrtKernelInfo* info, const std::string& name, int wtype, bool hands,
                              OpKernel& out) {
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
    return api->CreateStatus(ORT_NOT_IMPLEMENTED, (name + ": this CPU lacks the instructions of the " + kernels[variant]->name + " kernels").c_str());
  int64_t threads = 0;  // optional: how many threads run the product's tasks
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "threads", &threads)) {
    api->ReleaseStatus(status);
    threads = 0;
  }
  int64_t activation = kIdentity;  // optional: applied to scale * product + bias, before the residual
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "activation", &activation)) {
    api->ReleaseStatus(status);
    activation = kIdentity;
  }
  if (activation < 0 || activation >= kActivations)
    return fail(api, name + ": unknown activation " + std::to_string(activation) + " (0: none, 1: GELU, 2: tanh GELU, 3: quick GELU)");
  if (hands && !hands_bf16(n, *kernels[variant]))
    return fail(api, name + ": y is handed over as BF16 only by variants whose products read x as BF16, with n a multiple of 32 (" +
                         kernels[variant]->name + ", n = " + std::to_string(n) + ")");
  int64_t k = 0;  // optional: x's width where it is handed over as BF16
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "k", &k)) {
    api->ReleaseStatus(status);
    k = 0;
  }
  int64_t stream = 1;  // optional: 0 keeps y in the caches whatever its size
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "stream", &stream)) {
    api->ReleaseStatus(status);
    stream = 1;
  }
  if (stream != 0 && stream != 1) return fail(api, name + ": stream must be 0 or 1, not " + std::to_string(stream));
  out = OpKernel{api, kernels[variant], wtype, n, name, std::max<int64_t>(threads, 0), int(activation), hands, k, stream == 1};
  return nullptr;
}

namespace {

OrtStatus* compute(OpKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  Gemm g{};
  bool handed = false;
  std::vector<int64_t> xd, rd;
  const bool e4m3 = op->wtype == kE4M3;
  ORT_TRY(product_inputs(op, ctx, 2, e4m3 ? 3 : 2, g, handed, xd));
  size_t inputs = 0;
  ORT_TRY(api->KernelContext_GetInputCount(ctx, &inputs));
  const size_t residual_at = e4m3 ? 4 : 3;
  const OrtValue* residual = nullptr;
  if (inputs > residual_at) ORT_TRY(api->KernelContext_GetInput(ctx, residual_at, &residual));
  std::vector<int64_t> yd = handed ? std::vector<int64_t>{g.m, g.n} : xd;  // y's shape, as the residual has it
  yd.back() = g.n;
  if (residual) {
    ORT_TRY(shape_of(api, residual, rd));
    if (rd != yd) return fail(api, op->name + ": residual must have the output's shape [..., n]");
  }
  const std::vector<int64_t> out_dims = op->hands ? std::vector<int64_t>{g.m + kXRowsPad, g.n} : yd;
  OrtValue* y = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, out_dims.data(), out_dims.size(), &y));
  if (g.m == 0 || g.n == 0) return nullptr;
  void* data = nullptr;
  if (residual) {
    ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(residual), &data));
    g.residual = static_cast<const float*>(data);
  }
  ORT_TRY(api->GetTensorMutableData(y, &data));
  if (op->hands)
    g.yb = static_cast<uint16_t*>(data);
  else
    g.y = static_cast<float*>(data);
  ORT_TRY(round_x(op, ctx, g));
  return product_tasks(op, ctx, g);
}

template <int WType, bool Hands>
struct Op : OrtCustomOp {
  static const char* op_name() {
    return WType == kE4M3 ? (Hands ? "MatMulE4M3Handoff" : "MatMulE4M3") : (Hands ? "MatMulBF16Handoff" : "MatMulBF16");
  }
  Op() : OrtCustomOp{} {
    common<OpKernel, compute>(*this);
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      auto* kernel = new (std::nothrow) OpKernel{};
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      if (OrtStatus* status = product_attributes(api, info, std::string("ai.uform.") + op_name(), WType, Hands, *kernel)) {
        delete kernel;
        return status;
      }
      *out = kernel;
      return nullptr;
    };
    GetName = [](const OrtCustomOp*) { return op_name(); };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return WType == kE4M3 ? 5 : 4; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      if (i == 0) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // float32, or BF16 handed over (checked at run)
      if (i == 1) return WType == kE4M3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetOutputType = [](const OrtCustomOp*, size_t) { return Hands ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
      const size_t bias = WType == kE4M3 ? 3 : 2;  // then the residual
      return i >= bias ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
    };
  }
};

const Op<kBF16, false> matmul_bf16;
const Op<kE4M3, false> matmul_e4m3;
const Op<kBF16, true> matmul_bf16_handoff;
const Op<kE4M3, true> matmul_e4m3_handoff;

// -- LayerNormHandoff ---------------------------------------------------------------------

struct LayerNormKernel {
  const OrtApi* api;
  int variant;
  float epsilon;
  std::string name = "ai.uform.LayerNormHandoff";
};

OrtStatus* layer_norm(LayerNormKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  const OrtValue *x = nullptr, *scale = nullptr, *bias = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, 0, &x));
  ORT_TRY(api->KernelContext_GetInput(ctx, 1, &scale));
  ORT_TRY(api->KernelContext_GetInput(ctx, 2, &bias));
  std::vector<int64_t> xd, sd, bd;
  ORT_TRY(shape_of(api, x, xd));
  ORT_TRY(shape_of(api, scale, sd));
  ORT_TRY(shape_of(api, bias, bd));
  if (xd.empty() || !hands_bf16(xd.back(), *kernels[op->variant]))
    return fail(api, op->name + ": x must be [..., d] with d a multiple of 32");
  const int64_t d = xd.back();
  if (sd != std::vector<int64_t>{d} || bd != sd) return fail(api, op->name + ": scale and bias must be [d]");
  int64_t m = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) m *= xd[i];
  const int64_t dims[2] = {m + kXRowsPad, d};
  OrtValue* y = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, dims, 2, &y));
  if (m == 0) return nullptr;
  struct Call {
    const float *x, *scale, *bias;
    uint16_t* out;
    int64_t m, d;
    int variant;
    float epsilon;
  } call{};
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(x), &data));
  call.x = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(scale), &data));
  call.scale = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(bias), &data));
  call.bias = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(y, &data));
  call.out = static_cast<uint16_t*>(data);
  call.m = m, call.d = d, call.variant = op->variant, call.epsilon = op->epsilon;
  return api->KernelContext_ParallelFor(
      ctx,
      [](void* p, size_t i) {
        const Call& c = *static_cast<const Call*>(p);
        const int64_t first = int64_t(i) * kLayerNormBlock;
        layer_norm_block(c.variant, c.x, c.d, c.scale, c.bias, c.epsilon, c.out, first, std::min(kLayerNormBlock, c.m - first));
      },
      size_t((m + kLayerNormBlock - 1) / kLayerNormBlock), 0, &call);
}

struct LayerNormOp : OrtCustomOp {
  LayerNormOp() : OrtCustomOp{} {
    common<LayerNormKernel, layer_norm>(*this);
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      const std::string name = "ai.uform.LayerNormHandoff";
      int64_t variant = -1;
      if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "variant", &variant)) {
        api->ReleaseStatus(status);
        return fail(api, name + ": the attribute 'variant' is missing");
      }
      if (variant < 0 || variant >= kVariants) return fail(api, name + ": unknown variant " + std::to_string(variant));
      if (!kernels[variant]->bf16_x)
        return fail(api, name + ": a layer norm is handed over as BF16 only to variants whose products read x as BF16, not " +
                             kernels[variant]->name);
      if (!runnable(int(variant)))
        return api->CreateStatus(ORT_NOT_IMPLEMENTED, (name + ": this CPU lacks the instructions of the " + kernels[variant]->name + " kernels").c_str());
      float epsilon = 1e-5f;  // ONNX's default
      if (OrtStatus* status = api->KernelInfoGetAttribute_float(info, "epsilon", &epsilon)) api->ReleaseStatus(status);
      if (!(epsilon >= 0.0f)) return fail(api, name + ": epsilon must be a number >= 0");
      auto* kernel = new (std::nothrow) LayerNormKernel{api, int(variant), epsilon, name};
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      *out = kernel;
      return nullptr;
    };
    GetName = [](const OrtCustomOp*) { return "LayerNormHandoff"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };
    GetInputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16; };
  }
};

const LayerNormOp layer_norm_op;

// -- Attention ----------------------------------------------------------------------------

}  // namespace

OrtStatus* attention_inputs(const AttentionKernel* op, OrtKernelContext* ctx, size_t shape_at, size_t mask_at, int64_t rows, int64_t width3,
                            Attention& a) {
  const OrtApi* api = op->api;
  const std::string& name = op->name;
  size_t inputs = 0;
  ORT_TRY(api->KernelContext_GetInputCount(ctx, &inputs));
  const OrtValue *shape = nullptr, *mask = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, shape_at, &shape));
  if (inputs > mask_at) ORT_TRY(api->KernelContext_GetInput(ctx, mask_at, &mask));
  std::vector<int64_t> sd, md;
  ORT_TRY(shape_of(api, shape, sd));
  if (sd.size() != 1 || sd[0] != 2) return fail(api, name + ": shape must be int64 [2] (items, tokens)");
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(shape), &data));
  const int64_t items = static_cast<const int64_t*>(data)[0], tokens = static_cast<const int64_t*>(data)[1];
  if (items < 0 || tokens < 0 || rows != items * tokens || width3 % (3 * op->heads) != 0)
    return fail(api, name + ": qkv must be [items * tokens, 3 * heads * head_dim]");
  const int64_t width = width3 / 3, head_dim = width / op->heads;
  if (head_dim % 16 != 0) return fail(api, name + ": head_dim must be a multiple of 16");
  a = Attention{};
  if (mask) {
    ORT_TRY(shape_of(api, mask, md));
    const bool padding = md.size() == 4 && md[0] == items && md[1] == 1 && md[2] == 1 && md[3] == tokens;
    const bool causal = md.size() == 2 && md[0] == tokens && md[1] == tokens;
    if (!padding && !causal) return fail(api, name + ": mask must be [items, 1, 1, tokens] or [tokens, tokens]");
    ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(mask), &data));
    a.mask = static_cast<const float*>(data);
    a.mask_per_query = causal;
  }
  if (op->hands && width % 32 != 0) return fail(api, name + ": the context is handed over as BF16 only where its width is a multiple of 32");
  a.items = items, a.tokens = tokens, a.heads = op->heads, a.head_dim = head_dim;
  return nullptr;
}

OrtStatus* run_attention(const AttentionKernel* op, OrtKernelContext* ctx, const Attention& a) {
  struct Call {
    Attention a;
    AttentionTasks run;
    int64_t tasks, chunk;  // a piece of work: `chunk` tasks (attention_chunk)
  } call{a, op->run, a.items * op->heads, attention_chunk(a.tokens, a.items * op->heads)};
  if (call.tasks == 0) return nullptr;
  return op->api->KernelContext_ParallelFor(
      ctx,
      [](void* p, size_t i) {
        const Call& c = *static_cast<const Call*>(p);
        c.run(c.a, int64_t(i) * c.chunk, std::min(c.tasks, (int64_t(i) + 1) * c.chunk));
      },
      size_t((call.tasks + call.chunk - 1) / call.chunk), 0, &call);
}

OrtStatus* attention_attributes(const OrtApi* api, const OrtKernelInfo* info, const std::string& name, bool hands, AttentionKernel& out) {
  int64_t heads = 0;
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "heads", &heads)) {
    api->ReleaseStatus(status);
    return fail(api, name + ": the attribute 'heads' is missing");
  }
  if (heads < 1) return fail(api, name + ": heads must be positive");
  int64_t variant = runnable(kAVX512) ? kAVX512 : kAVX2;  // optional: the kernels' variant
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "variant", &variant)) api->ReleaseStatus(status);
  if (variant < 0 || variant >= kVariants) return fail(api, name + ": variant must be 0 to 5");
  if (hands && !kernels[variant]->bf16_x)
    return fail(api, name + ": the context is handed over as BF16 only to variants whose products read x as BF16, not " + kernels[variant]->name);
  const int needs = attention_needs(int(variant));
  if (!runnable(needs))
    return api->CreateStatus(ORT_NOT_IMPLEMENTED, (name + (needs == kAMX          ? ": this process cannot run the amx kernels (no tiles granted)"
                                                           : needs == kAVX512BF16 ? ": this CPU lacks AVX-512 BF16"
                                                           : needs == kAVX512     ? ": this CPU lacks AVX-512"
                                                                                  : ": this CPU lacks AVX2 and FMA")).c_str());
  out = AttentionKernel{api, heads, attention_kernel(int(variant)), name, hands};
  return nullptr;
}

namespace {

OrtStatus* attend(AttentionKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  const OrtValue* qkv = nullptr;
  ORT_TRY(api->KernelContext_GetInput(ctx, 0, &qkv));
  std::vector<int64_t> qd;
  ORT_TRY(shape_of(api, qkv, qd));
  if (qd.size() != 2) return fail(api, op->name + ": qkv must be [items * tokens, 3 * heads * head_dim]");
  Attention a{};
  ORT_TRY(attention_inputs(op, ctx, 1, 2, qd[0], qd[1], a));
  const int64_t rows = a.items * a.tokens, width = qd[1] / 3;
  const int64_t dims[2] = {rows + (op->hands ? kXRowsPad : 0), width};
  OrtValue* out = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, dims, 2, &out));
  if (rows == 0) return nullptr;
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(const_cast<OrtValue*>(qkv), &data));
  a.qkv = static_cast<const float*>(data);
  ORT_TRY(api->GetTensorMutableData(out, &data));
  if (op->hands)
    a.handed = static_cast<uint16_t*>(data);
  else
    a.out = static_cast<float*>(data);
  return run_attention(op, ctx, a);
}

template <bool Hands>
struct AttentionOp : OrtCustomOp {
  static std::string op_name() { return Hands ? "ai.uform.AttentionHandoff" : "ai.uform.Attention"; }
  AttentionOp() : OrtCustomOp{} {
    common<AttentionKernel, attend>(*this);
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      auto* kernel = new (std::nothrow) AttentionKernel{};
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      if (OrtStatus* status = attention_attributes(api, info, op_name(), Hands, *kernel)) {
        delete kernel;
        return status;
      }
      *out = kernel;
      return nullptr;
    };
    GetName = [](const OrtCustomOp*) { return Hands ? "AttentionHandoff" : "Attention"; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) { return i == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return Hands ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  }
};

const AttentionOp<false> attention_op;
const AttentionOp<true> attention_handoff_op;

}  // namespace
}  // namespace uform

using namespace uform;

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
  ORT_TRY(api->CustomOpDomain_Add(domain, &matmul_bf16_handoff));
  ORT_TRY(api->CustomOpDomain_Add(domain, &matmul_e4m3_handoff));
  ORT_TRY(api->CustomOpDomain_Add(domain, &layer_norm_op));
  ORT_TRY(api->CustomOpDomain_Add(domain, &attention_handoff_op));
  ORT_TRY(api->CustomOpDomain_Add(domain, &attention_op));
  ORT_TRY(add_qkv_attention_ops(api, domain));
  return api->AddCustomOpDomain(options, domain);
}
