// A block's qkv projection and its attention as one op, a chunk of items at a time, so that a
// chunk's qkv (float32, [rows, 3 W]) is read by the attention from the caches it was written to
// rather than from memory (64 base texts: 51 MiB a block, written by the product and read back).
//
//   QKVAttentionBF16(X, W: uint16, shape: int64[2], bias?: float[3W], mask?) -> float[B * T, W]
//   QKVAttentionE4M3(X, W: uint8, shape, scale: float[3W], bias?, mask?)
//   QKVAttentionBF16Handoff, QKVAttentionE4M3Handoff: the context handed over (AttentionHandoff's)
//
// X as a product's (float32 [B * T, W], or BF16 handed over with the attribute `k`), W packed for
// `variant`, the attributes of both ops (`variant`, `n` = 3 W, `threads`, `k`, `stream`, `heads`;
// no activation) and, optionally, `items` (items a chunk; absent: as many as 4 MiB of qkv hold),
// and exactly the bits of the MatMul op followed by the Attention op: a product's
// row is the same whatever rows beside it (the rows issue), and an attention task reads its own
// item's rows alone. The chunk's rows start where x's layout allows (amx's blocks of 16 rows: up
// to 15 rows of the chunk before are computed again and not read).
#include <algorithm>

#include "ops.h"

namespace uform {
namespace {

constexpr int64_t kChunkBytes = int64_t(4) << 20;  // a chunk's qkv, float32: items of at least one

struct QKVKernel {
  const OrtApi* api = nullptr;
  std::string name;
  OpKernel product{};
  AttentionKernel attention{};
  int64_t items = 0;  // attribute `items`: items a chunk (0 or absent: as many as kChunkBytes of qkv hold)
};

OrtStatus* qkv_attend(QKVKernel* op, OrtKernelContext* ctx) {
  const OrtApi* api = op->api;
  const bool e4m3 = op->product.wtype == kE4M3;
  const size_t bias_at = e4m3 ? 4 : 3;  // x, w, shape, (scale), bias?, mask?
  Gemm base{};
  bool handed = false;
  std::vector<int64_t> xd;
  ORT_TRY(product_inputs(&op->product, ctx, 3, bias_at, base, handed, xd));
  Attention a{};
  ORT_TRY(attention_inputs(&op->attention, ctx, 2, bias_at + 1, base.m, base.n, a));
  const int64_t rows = base.m, width = base.n / 3, t = a.tokens;
  const int64_t dims[2] = {rows + (op->attention.hands ? kXRowsPad : 0), width};
  OrtValue* out = nullptr;
  ORT_TRY(api->KernelContext_GetOutput(ctx, 0, dims, 2, &out));
  if (rows == 0) return nullptr;
  void* data = nullptr;
  ORT_TRY(api->GetTensorMutableData(out, &data));
  if (op->attention.hands)
    a.handed = static_cast<uint16_t*>(data);
  else
    a.out = static_cast<float*>(data);
  ORT_TRY(round_x(&op->product, ctx, base));  // float32 x where the kernels read BF16: every row, once
  const int64_t per_item = t * base.n * int64_t(sizeof(float));
  const int64_t chunk = op->items > 0 ? op->items : std::max<int64_t>(1, kChunkBytes / per_item);
  const int64_t align = base.xb ? 16 : 1;  // BF16 x (amx's layout): a chunk starts on a block of 16 rows
  float* qkv = static_cast<float*>(thread_scratch(kQKV, size_t(std::min(a.items, chunk) * t + align) * size_t(base.n) * sizeof(float)));
  for (int64_t first = 0; first < a.items; first += chunk) {
    const int64_t last = std::min(a.items, first + chunk), r0 = first * t, start = r0 / align * align;
    Gemm g = base;
    g.m = last * t - start;
    if (base.xb)
      g.xb = base.xb + start * base.kpad;
    else
      g.x = base.x + start * base.k;
    g.y = qkv, g.yb = nullptr, g.residual = nullptr, g.stream = false;  // read next, from the caches
    ORT_TRY(product_tasks(&op->product, ctx, g));
    Attention c = a;
    c.qkv = qkv + (r0 - start) * base.n;
    c.items = last - first;
    c.first_row = r0;
    if (a.mask && !a.mask_per_query) c.mask = a.mask + r0;  // [items, 1, 1, tokens]: the chunk's items
    ORT_TRY(run_attention(&op->attention, ctx, c));
  }
  return nullptr;
}

template <int WType, bool Hands>
struct QKVOp : OrtCustomOp {
  static const char* op_name() {
    return WType == kE4M3 ? (Hands ? "QKVAttentionE4M3Handoff" : "QKVAttentionE4M3") : (Hands ? "QKVAttentionBF16Handoff" : "QKVAttentionBF16");
  }
  QKVOp() : OrtCustomOp{} {
    common<QKVKernel, qkv_attend>(*this);
    CreateKernelV2 = [](const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) -> OrtStatus* {
      const std::string name = std::string("ai.uform.") + op_name();
      auto* kernel = new (std::nothrow) QKVKernel();
      if (!kernel) return api->CreateStatus(ORT_FAIL, "out of memory");
      kernel->api = api;
      kernel->name = name;
      OrtStatus* status = product_attributes(api, info, name, WType, false, kernel->product);
      if (!status) status = attention_attributes(api, info, name, Hands, kernel->attention);
      if (!status && kernel->product.activation != kIdentity) status = fail(api, name + ": the qkv projection takes no activation");
      if (!status) {
        if (OrtStatus* absent = api->KernelInfoGetAttribute_int64(info, "items", &kernel->items)) {
          api->ReleaseStatus(absent);
          kernel->items = 0;
        }
        if (kernel->items < 0) status = fail(api, name + ": items must be 0 or more");
      }
      if (status) {
        delete kernel;
        return status;
      }
      *out = kernel;
      return nullptr;
    };
    GetName = [](const OrtCustomOp*) { return op_name(); };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return WType == kE4M3 ? 6 : 5; };
    GetInputType = [](const OrtCustomOp*, size_t i) {
      if (i == 0) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // float32, or BF16 handed over (checked at run)
      if (i == 1) return WType == kE4M3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
      return i == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
      return i >= size_t(WType == kE4M3 ? 4 : 3) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // bias, mask
    };
    GetOutputType = [](const OrtCustomOp*, size_t) { return Hands ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  }
};

const QKVOp<kBF16, false> qkv_bf16;
const QKVOp<kE4M3, false> qkv_e4m3;
const QKVOp<kBF16, true> qkv_bf16_handoff;
const QKVOp<kE4M3, true> qkv_e4m3_handoff;

}  // namespace

OrtStatus* add_qkv_attention_ops(const OrtApi* api, OrtCustomOpDomain* domain) {
  return add_ops(api, domain, {&qkv_bf16, &qkv_e4m3, &qkv_bf16_handoff, &qkv_e4m3_handoff});
}

}  // namespace uform
