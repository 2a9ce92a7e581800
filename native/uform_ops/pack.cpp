// Packing weights for the kernels, and E4M3: the exact decoding tables and the quantization
// (round to nearest even, saturating at 448, a scale per output row).
#include <cfloat>
#include <cmath>
#include <cstring>

#include "library.h"

namespace uform {
namespace {

float decode_e4m3(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return 0.0f;  // NaN: never written by quantize
  const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

inline float widen(uint16_t bf16) {
  const uint32_t bits = uint32_t(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rows [begin, end) of w, one panel's at most, copied into their packed places: a blocked
// transpose, 32 consecutive k of each row (a cache line of a row) at a time.
void copy_bf16(const uint16_t* w, int64_t k, const Kernel& kern, uint16_t* out, int64_t begin, int64_t end) {
  const int64_t nr = kern.nr, step = 32;
  uint16_t* dst = out + begin / nr * panel_elements(k, kern);
  if (kern.pair == 1) {
    for (int64_t i0 = 0; i0 < k; i0 += step) {
      const int64_t i1 = std::min(k, i0 + step);
      for (int64_t r = begin; r < end; ++r)
        for (int64_t i = i0, c = r % nr; i < i1; ++i) dst[i * nr + c] = w[r * k + i];
    }
    return;
  }
  const int64_t pairs = k / 2;  // pair == 2: a BF16 pair moves as one 32-bit word
  for (int64_t p0 = 0; p0 < pairs; p0 += step / 2) {
    const int64_t p1 = std::min(pairs, p0 + step / 2);
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = w + r * k;
      const int64_t c = r % nr;
      for (int64_t p = p0; p < p1; ++p) std::memcpy(dst + (p * nr + c) * 2, row + 2 * p, 4);
    }
  }
  if (k & 1)
    for (int64_t r = begin; r < end; ++r) dst[(pairs * nr + r % nr) * 2] = w[r * k + k - 1];
}

// Rows [begin, end) of w (BF16 bits, [n, k]) written into `out` packed for `kern`, as BF16
// or quantized to E4M3 with a scale per row; answers -1, or the flat index of a weight that
// is NaN or infinite. `out` arrives zeroed (the padding stays zero).
}  // namespace

int64_t pack_rows(const uint16_t* w, int64_t k, const Kernel& kern, int wtype, void* out, float* scale, int64_t begin,
                  int64_t end) {
  const int64_t size = panel_elements(k, kern), nr = kern.nr, pair = kern.pair;
  std::vector<uint8_t> codes(wtype == kE4M3 ? size_t(k) : 0);
  for (int64_t r = begin; r < end; ++r) {
    const uint16_t* row = w + r * k;
    const uint16_t top = max_magnitude_avx2(row, k);  // every variant's machine has AVX2
    if (top >= 0x7F80u) {
      for (int64_t i = 0; i < k; ++i)
        if ((row[i] & 0x7F80u) == 0x7F80u) return r * k + i;
    }
    const int64_t base = r / nr * size, c = r % nr;
    if (wtype == kBF16) continue;  // copied below, a panel at a time
    const float amax = widen(top);
    const float inverse = amax > 0.0f ? std::min(448.0f / amax, FLT_MAX) : 1.0f;  // a subnormal amax: no infinity
    scale[r] = amax > 0.0f ? amax / 448.0f : 1.0f;
    encode_e4m3_avx2(row, k, inverse, codes.data());
    uint8_t* dst = static_cast<uint8_t*>(out) + base;
    if (pair == 2) {
      for (int64_t p = 0; p < k / 2; ++p) std::memcpy(dst + (p * nr + c) * 2, codes.data() + 2 * p, 2);
      if (k & 1) dst[(k / 2 * nr + c) * 2] = codes[k - 1];
    } else {
      for (int64_t i = 0; i < k; ++i) dst[i * nr + c] = codes[i];
    }
  }
  if (wtype == kBF16) copy_bf16(w, k, kern, static_cast<uint16_t*>(out), begin, end);
  return -1;
}

// `count` pieces of work over `threads` std::threads (for the ctypes entries, outside ORT).
// Round to nearest even, saturating at ±448 (E4M3FN has no infinity). Branch-free so that
// a row's codes vectorize: normal magnitudes keep 3 mantissa bits and rebias the exponent
// from 127 to 7; below 2^-6 the codes count multiples of 2^-9.
uint8_t encode_e4m3(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t sign = (bits >> 24) & 0x80u;
  bits &= 0x7FFFFFFFu;
  float a;
  std::memcpy(&a, &bits, 4);
  const uint32_t rounded = bits + 0x7FFFFu + ((bits >> 20) & 1u);
  const uint32_t normal = std::min<uint32_t>((rounded >> 20) - std::min<uint32_t>(rounded >> 20, 120u << 3), 0x7Eu);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds [0, 2^22) to an integer, ties to even
  const uint32_t subnormal = uint32_t((std::min(a, 1.0f) * 512.0f + magic) - magic);
  return uint8_t(sign | (a < 0.015625f ? subnormal : normal));
}

const float e4m3_to_f32[256] = {
#define D(i) decode_e4m3(uint8_t(i))
#define D8(i) D(i), D(i + 1), D(i + 2), D(i + 3), D(i + 4), D(i + 5), D(i + 6), D(i + 7)
#define D64(i) D8(i), D8(i + 8), D8(i + 16), D8(i + 24), D8(i + 32), D8(i + 40), D8(i + 48), D8(i + 56)
    D64(0), D64(64), D64(128), D64(192)};

const uint16_t e4m3_to_bf16[256] = {
#define B(i) uint16_t([] (float f) { uint32_t b; std::memcpy(&b, &f, 4); return b >> 16; }(decode_e4m3(uint8_t(i))))
#define B8(i) B(i), B(i + 1), B(i + 2), B(i + 3), B(i + 4), B(i + 5), B(i + 6), B(i + 7)
#define B64(i) B8(i), B8(i + 8), B8(i + 16), B8(i + 24), B8(i + 32), B8(i + 40), B8(i + 48), B8(i + 56)
    B64(0), B64(64), B64(128), B64(192)};

}  // namespace uform
