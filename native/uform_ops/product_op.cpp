// The matrix products as ONNX Runtime ops (domain "ai.uform"; the graph rewrite in
// uform/plugins/e4m3.py emits them):
//   MatMulBF16(X: float[..., k], W: uint16 BF16 bits, bias?: float[n], residual?: float[..., n]) -> float[..., n]
//   MatMulE4M3(X: float[..., k], W: uint8 E4M3FN codes, scale: float[n], bias?: float[n], residual?: float[..., n])
// each computing y = act(scale * (x @ W^T) + bias) + residual for the checkpoint's [n, k]
// matrix W, held packed for the kernels (uform_pack), with the attributes `variant` (0 avx2,
// 1 avx512, 2 avx512-bf16, 3 avx2-split, 4 amx, 5 amx-model) naming the kernels, `n` the output width and,
// optionally, `threads` the session's intra-op threads (variants that cut a product by its
// shape size tasks to it), `activation` (0 or absent: none; 1: GELU, exact; 2: GELU,
// tanh's approximation; 3: quick GELU, x * sigmoid(1.702 x)) and `stream` (0: y stays in the
// caches; absent or 1: the amx kernels write a y of 4 MiB or more past them);
//   MatMulBF16Handoff, MatMulE4M3Handoff: the same, with y handed to the one product that reads it
// as its x, rounded to BF16 as that product would round it and laid out as its kernels read x
// (Gemm::yb): uint16 [m + 16, n] for m rows (16 rows of padding the kernels may read), for the
// variants whose products read x as BF16 (avx512-bf16, amx, amx-model) with n a multiple of 32.
// The product reading it takes that as X, with the attribute `k` (= the handing product's n):
// one pass over memory instead of a float32 y written, read, rounded, written again and read,
// and the same bits. Every product's X is either.
#include <algorithm>
#include <string>
#include <vector>

#include "ops.h"

namespace uform {
namespace {

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

}  // namespace

OrtStatus* add_product_ops(const OrtApi* api, OrtCustomOpDomain* domain) {
  return add_ops(api, domain, {&matmul_bf16, &matmul_e4m3, &matmul_bf16_handoff, &matmul_e4m3_handoff});
}

}  // namespace uform
