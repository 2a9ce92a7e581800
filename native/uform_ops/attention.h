// Fused multi-head attention (attention.cpp, AVX-512 F; attention_bf16.cpp, its values as BF16
// products; attention_avx2.cpp, AVX2 with FMA; attention_amx.cpp and attention_amx_model.cpp, BF16
// tile products): what one call computes, and its task.
#pragma once

#include <cstdint>

#include "staging.h"

namespace uform {

struct Attention {
  const float* qkv;     // [items * tokens, 3 * heads * head_dim]: q, k, v of each token
  const float* mask;    // additive: [items, tokens] (padding), [tokens, tokens] (causal), or null
  bool mask_per_query;  // the [tokens, tokens] form
  float* out;           // [items * tokens, heads * head_dim]
  int64_t items, tokens, heads, head_dim;  // head_dim a multiple of 16
  int64_t item;  // the item a task works on (set by the task)
  // Where set (the kernels of the variants whose products read x as BF16, W a multiple of 32), the
  // context goes here instead of `out`: rounded to BF16 (nearest even) in the layout the next
  // product's kernels read x in, [items * tokens + 16, W] (the AttentionHandoff op).
  uint16_t* handed = nullptr;
  // The row of `out` (or `handed`) item 0's first token goes to: qkv, mask and items may be a
  // chunk of a call's (the QKVAttention ops run theirs a chunk of items at a time).
  int64_t first_row = 0;
};

// Tasks [begin, end): task (item, head) = (task / heads, task % heads); tasks touch disjoint parts
// of `out`.
void attention_tasks(const Attention& a, int64_t begin, int64_t end);       // AVX-512 F, float32
void attention_tasks_avx2(const Attention& a, int64_t begin, int64_t end);  // AVX2 with FMA, float32
void attention_tasks_bf16(const Attention& a, int64_t begin, int64_t end);  // AVX-512 BF16: float32 scores, BF16 values
// BF16 tile products (attention_tiles.inc) at every length, so that a row's bits do not depend on
// the length its batch pads it to: on AMX's tiles, and on the scalar model of them.
void attention_tasks_amx(const Attention& a, int64_t begin, int64_t end);
void attention_tasks_amx_model(const Attention& a, int64_t begin, int64_t end);

using AttentionTasks = void (*)(const Attention&, int64_t, int64_t);
// The tasks `variant`'s loads run, and the variant whose instructions they take (entries.cpp).
AttentionTasks attention_kernel(int variant);
int attention_needs(int variant);

// How many of a call's `tasks` a thread takes at once: one where a task is long, more where it is
// short (a run of tile tasks configures the tiles once: LDTILECFG and TILERELEASE were a fifth of
// an 8-token task), but never fewer than 8 pieces where there are 8 tasks (a 12-head query on
// 2 threads in 3 pieces left one thread a piece behind). At least 1, also for no tasks: callers
// divide by it.
inline int64_t attention_chunk(int64_t tokens, int64_t tasks) {
  const int64_t by_length = tokens >= 64 ? 1 : 64 / (tokens > 0 ? tokens : 1), by_count = (tasks + 7) / 8;
  const int64_t chunk = by_length < by_count ? by_length : by_count;
  return chunk > 0 ? chunk : 1;
}

}  // namespace uform
