// What the library's ONNX Runtime ops share (product_op.cpp, layer_norm_op.cpp, attention_op.cpp,
// qkv_attention.cpp; ops.cpp registers them): their kernels' state, the checks of their inputs,
// and the pieces of a product and of an attention that run on ONNX Runtime's intra-op pool.
#pragma once

#include <onnxruntime_c_api.h>

#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "attention.h"
#include "library.h"

namespace uform {

#define ORT_TRY(expr)                                \
  do {                                               \
    if (OrtStatus* status_ = (expr)) return status_; \
  } while (0)

// Adds each of `ops` to `domain` (a file's op registrations), stopping at the first error.
inline OrtStatus* add_ops(const OrtApi* api, OrtCustomOpDomain* domain, std::initializer_list<const OrtCustomOp*> ops) {
  for (const OrtCustomOp* op : ops) ORT_TRY(api->CustomOpDomain_Add(domain, op));
  return nullptr;
}

// A product op's kernel: its attributes.
struct OpKernel {
  const OrtApi* api;
  const Kernel* kern;
  int wtype;
  int64_t n;
  std::string name;
  int64_t threads;  // the session's intra-op threads (attribute `threads`; 0 when absent)
  int activation;   // attribute `activation` (kIdentity when absent)
  bool hands;       // y handed to the next product as BF16 (the ...Handoff ops)
  int64_t k;        // attribute `k`: X's width where it is handed over as BF16 (0 when absent)
  bool stream;      // attribute `stream`: y may go past the caches (1 when absent; Gemm::stream)
};

// An attention op's kernel: its attributes.
struct AttentionKernel {
  const OrtApi* api;
  int64_t heads;
  AttentionTasks run;  // the variant's (attention_kernel)
  std::string name = "ai.uform.Attention";
  bool hands = false;  // the context handed to the next product as BF16 (AttentionHandoff)
};

OrtStatus* fail(const OrtApi* api, const std::string& msg);
OrtStatus* shape_of(const OrtApi* api, const OrtValue* value, std::vector<int64_t>& dims);

// A product's attributes read from `info` for op `name` (variant, n, threads, activation, k,
// stream) into `out`, checked; `hands`: whether it is a ...Handoff op.
OrtStatus* product_attributes(const OrtApi* api, const OrtKernelInfo* info, const std::string& name, int wtype, bool hands,
                              OpKernel& out);

// A product's x (input 0), w (1), scale (input `scale_at`, E4M3) and bias (`bias_at`, optional)
// checked and set in g with m, n, k, kpad, the attributes and a serial; `handed`: x arrives as
// BF16 (Gemm::xb), else float32 (Gemm::x, `xd` its shape). y, yb and residual are the caller's.
OrtStatus* product_inputs(const OpKernel* op, OrtKernelContext* ctx, size_t scale_at, size_t bias_at, Gemm& g, bool& handed,
                          std::vector<int64_t>& xd);

// Where the kernels read x as BF16 and it arrived as float32: x rounded into the calling
// thread's rounded_x, g.xb set to it. Then every task of g (its rows, whatever m).
OrtStatus* round_x(const OpKernel* op, OrtKernelContext* ctx, Gemm& g);
OrtStatus* product_tasks(const OpKernel* op, OrtKernelContext* ctx, Gemm& g);

// An attention's shape (input `shape_at`: int64 (items, tokens)) and mask (input `mask_at`,
// optional) checked into a (items, tokens, heads, head_dim, mask); `rows` and `width3` the
// qkv it reads ([rows, 3 W]).
OrtStatus* attention_inputs(const AttentionKernel* op, OrtKernelContext* ctx, size_t shape_at, size_t mask_at, int64_t rows, int64_t width3,
                            Attention& a);

// Every (item, head) task of a, in chunks, on the pool.
OrtStatus* run_attention(const AttentionKernel* op, OrtKernelContext* ctx, const Attention& a);

// The session-time checks of an attention's variant for op `name` (heads, and the tiles or
// instructions it needs), into `out`.
OrtStatus* attention_attributes(const OrtApi* api, const OrtKernelInfo* info, const std::string& name, bool hands, AttentionKernel& out);

// What every op of the library shares: it runs on the CPU provider, makes one float output,
// takes no variadic arguments, and its kernels (of type K, with `api` and `name`) compute
// through Run, an allocation that fails becoming a status that names the op.
template <class K, OrtStatus* (*Run)(K*, OrtKernelContext*)>
void common(OrtCustomOp& op) {
  op.version = ORT_API_VERSION;
  op.KernelComputeV2 = [](void* kernel, OrtKernelContext* ctx) -> OrtStatus* {
    auto* k = static_cast<K*>(kernel);
    try {
      return Run(k, ctx);
    } catch (const std::bad_alloc&) {
      return k->api->CreateStatus(ORT_FAIL, (k->name + ": out of memory").c_str());
    }
  };
  op.KernelDestroy = [](void* kernel) { delete static_cast<K*>(kernel); };
  op.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
  op.GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
  op.GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op.GetEndVersion = [](const OrtCustomOp*) { return 1 << 30; };
}

// Each room's ops added to the domain (ops.cpp's RegisterCustomOps): the products
// (product_op.cpp), LayerNormHandoff (layer_norm_op.cpp), Attention and AttentionHandoff
// (attention_op.cpp), the QKVAttention ops (qkv_attention.cpp).
OrtStatus* add_product_ops(const OrtApi* api, OrtCustomOpDomain* domain);
OrtStatus* add_layer_norm_op(const OrtApi* api, OrtCustomOpDomain* domain);
OrtStatus* add_attention_ops(const OrtApi* api, OrtCustomOpDomain* domain);
OrtStatus* add_qkv_attention_ops(const OrtApi* api, OrtCustomOpDomain* domain);

}  // namespace uform
