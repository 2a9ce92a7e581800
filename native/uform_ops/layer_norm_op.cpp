// LayerNormHandoff as an ONNX Runtime op (domain "ai.uform"):
//   LayerNormHandoff(X: float[..., d], scale: float[d], bias: float[d]) -> uint16 [m + 16, d]
// a layer norm over the last axis (attribute `epsilon`) handed to the one product that reads it,
// rounded to BF16 in the layout that product's kernels read x in (attribute `variant`, d a
// multiple of 32); the rows are layer_norm.cpp's.
#include <algorithm>
#include <string>
#include <vector>

#include "ops.h"

namespace uform {
namespace {

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

}  // namespace

OrtStatus* add_layer_norm_op(const OrtApi* api, OrtCustomOpDomain* domain) { return api->CustomOpDomain_Add(domain, &layer_norm_op); }

}  // namespace uform
