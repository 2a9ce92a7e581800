// Attention as ONNX Runtime ops (domain "ai.uform"):
//   Attention(qkv: float[B * T, 3 * W], shape: int64[2] = (B, T), mask?: float) -> float[B * T, W]
// multi-head attention of `heads` heads over a fused qkv projection, the additive mask
// [B, 1, 1, T] (padding) or [T, T] (causal), float32 throughout, with the optional attribute
// `variant` (0 and 3: AVX2 with FMA; 1: AVX-512 F; 2: AVX-512 F scores and AVX-512 BF16 values; 4 and 5: BF16
// tiles and their model; absent: AVX-512 F where the CPU has it);
//   AttentionHandoff: the same with its context handed to the one product that reads it, uint16
// [B * T + 16, W] (W a multiple of 32), as MatMulBF16Handoff hands y (product_op.cpp).
// The kernels are attention*.cpp's, a task an (item, head).
#include <algorithm>
#include <string>
#include <vector>

#include "ops.h"

namespace uform {

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

OrtStatus* add_attention_ops(const OrtApi* api, OrtCustomOpDomain* domain) {
  return add_ops(api, domain, {&attention_handoff_op, &attention_op});
}

}  // namespace uform
