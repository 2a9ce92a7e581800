// Fused multi-head attention (attention.cpp, AVX-512 F; attention_avx2.cpp, AVX2 with FMA): what one
// call computes, and its task.
#pragma once

#include <cstdint>

namespace uform {

struct Attention {
  const float* qkv;     // [items * tokens, 3 * heads * head_dim]: q, k, v of each token
  const float* mask;    // additive: [items, tokens] (padding), [tokens, tokens] (causal), or null
  bool mask_per_query;  // the [tokens, tokens] form
  float* out;           // [items * tokens, heads * head_dim]
  int64_t items, tokens, heads, head_dim;  // head_dim a multiple of 16
  int64_t item;  // the item a task works on (set by the task)
};

// Task (item, head) = (task / heads, task % heads); tasks touch disjoint parts of `out`.
void attention_task(const Attention& a, int64_t task);       // AVX-512 F
void attention_task_avx2(const Attention& a, int64_t task);  // AVX2 with FMA

}  // namespace uform
