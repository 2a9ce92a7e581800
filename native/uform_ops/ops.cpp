// uform's op library as ONNX Runtime sees it: RegisterCustomOps, which adds the library's ops to
// the domain "ai.uform" (the graph rewrite in uform/plugins/e4m3.py emits them), each in a room of
// its own: the matrix products (product_op.cpp), the layer norm handing its rows over
// (layer_norm_op.cpp), attention (attention_op.cpp), and a block's qkv projection and attention as
// one op (qkv_attention.cpp); ops.h holds what they share. (entries.cpp holds the plain C functions
// the Python side calls through ctypes; pack.cpp the packing and quantization.)
//
// A kernel whose instructions this CPU lacks is refused when the session is created, with a
// message; nothing runs an illegal instruction. Work runs on ONNX Runtime's intra-op thread pool
// (KernelContext_ParallelFor).
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

}  // namespace uform

using namespace uform;

UFORM_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api) return nullptr;  // an ONNX Runtime older than the headers: the Python side refuses it first
  // One domain for every session, made by the first call and kept as long as the library is
  // loaded: ONNX Runtime never releases a domain a library gives it (its sessions only point at
  // it), so a domain made per call was kept for good each time, every tower of every load
  // (tests/test_long_runs.py). Its ops are the library's static objects, the same for all, so
  // sharing it changes nothing a session sees.
  static std::mutex lock;
  static OrtCustomOpDomain* shared = nullptr;
  std::lock_guard<std::mutex> hold(lock);
  if (!shared) {
    OrtCustomOpDomain* domain = nullptr;
    ORT_TRY(api->CreateCustomOpDomain("ai.uform", &domain));
    OrtStatus* status = add_product_ops(api, domain);
    if (!status) status = add_layer_norm_op(api, domain);
    if (!status) status = add_attention_ops(api, domain);
    if (!status) status = add_qkv_attention_ops(api, domain);
    if (status) {
      api->ReleaseCustomOpDomain(domain);
      return status;
    }
    shared = domain;
  }
  return api->AddCustomOpDomain(options, shared);
}
