// Attention on AMX's tiles for the amx variant (attention_tiles.inc over TILELOADD, TDPBF16PS,
// TILESTORED, and VCVTNEPS2BF16 for the rounding), at every length: a text's length is its
// batch's longest, and a float32 kernel below some length would give a row other bits alone than
// beside a longer text. The amx variant runs only where amx_refusal() answered null (the op and
// the ctypes entry check runnable(kAMX) first), so no tile instruction is reached without the tile
// state granted.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "attention.h"

// Only after every include (attention.cpp says why).
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace uform {
namespace {

#define TILE_LOAD(T, p, stride) _tile_loadd(T, p, stride)
#define TILE_ZERO(T) _tile_zero(T)
#define TILE_DP(C, A, B) _tile_dpbf16ps(C, A, B)
#define TILE_STORE(T, p, stride) _tile_stored(T, p, stride)
inline void store_config(void* c) { _tile_storeconfig(c); }
inline void load_config(const void* c) { _tile_loadconfig(c); }
inline void release_tiles() { _tile_release(); }
#define UFORM_VFMA(a, b, c) F(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c)))
#define ROUND_BF16(x) H((__m256i)_mm512_cvtneps_pbh(__m512(x)))  // VCVTNEPS2BF16 (the amx variant needs avx512-bf16)
#define PAIR_BF16(even, odd)                                                                                       \
  U(_mm512_permutexvar_epi16(_mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, \
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0),                    \
                             (__m512i)_mm512_cvtne2ps_pbh(__m512(odd), __m512(even))))

#include "attention_tiles.inc"

}  // namespace

void attention_tasks_amx(const Attention& a, int64_t begin, int64_t end) { tile_tasks(a, begin, end); }

}  // namespace uform
