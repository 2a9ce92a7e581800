// PNG scanlines unfiltered (the None, Sub, Up, Average and Paeth filters of the PNG
// specification, section 9), for the image plugin's row-by-row PNG reader
// (uform/plugins/media/png.py): Average and Paeth read the byte just written, so a row is one
// sequential pass, which Python cannot make fast.
#include "library.h"

namespace {

inline uint8_t paeth(int a, int b, int c) {
  const int pa = b > c ? b - c : c - b;            // |p - a|, p = a + b - c
  const int pb = a > c ? a - c : c - a;            // |p - b|
  const int pc = a + b > 2 * c ? a + b - 2 * c : 2 * c - a - b;  // |p - c|
  return static_cast<uint8_t>(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

}  // namespace

// `count` scanlines of `stride` bytes each: `filtered` holds each as its filter type byte then
// its `stride` bytes; `prior` is the row above the first (all zeros above an image's first row)
// and receives the last row; `bpp` the bytes a pixel takes (1 below 8 bits a pixel). The rows
// are written, unfiltered, to `out` (count x stride bytes). Returns -1, or the index of the
// first row whose filter type is not 0-4 (that row and those after it are not written).
UFORM_EXPORT int64_t uform_png_unfilter(const uint8_t* filtered, int64_t count, int64_t stride, int64_t bpp, uint8_t* prior,
                                        uint8_t* out) {
  if (count <= 0 || stride <= 0) return -1;
  const uint8_t* up = prior;
  for (int64_t r = 0; r < count; ++r) {
    const uint8_t* in = filtered + r * (stride + 1);
    uint8_t* row = out + r * stride;
    const uint8_t kind = in[0];
    ++in;
    const int64_t lead = bpp < stride ? bpp : stride;
    switch (kind) {
      case 0:
        for (int64_t i = 0; i < stride; ++i) row[i] = in[i];
        break;
      case 1:
        for (int64_t i = 0; i < lead; ++i) row[i] = in[i];
        for (int64_t i = lead; i < stride; ++i) row[i] = static_cast<uint8_t>(in[i] + row[i - bpp]);
        break;
      case 2:
        for (int64_t i = 0; i < stride; ++i) row[i] = static_cast<uint8_t>(in[i] + up[i]);
        break;
      case 3:
        for (int64_t i = 0; i < lead; ++i) row[i] = static_cast<uint8_t>(in[i] + (up[i] >> 1));
        for (int64_t i = lead; i < stride; ++i) row[i] = static_cast<uint8_t>(in[i] + ((row[i - bpp] + up[i]) >> 1));
        break;
      case 4:
        for (int64_t i = 0; i < lead; ++i) row[i] = static_cast<uint8_t>(in[i] + up[i]);  // a = c = 0: Paeth picks b
        for (int64_t i = lead; i < stride; ++i) row[i] = static_cast<uint8_t>(in[i] + paeth(row[i - bpp], up[i], up[i - bpp]));
        break;
      default:
        if (r > 0)
          for (int64_t i = 0; i < stride; ++i) prior[i] = out[(r - 1) * stride + i];
        return r;
    }
    up = row;
  }
  for (int64_t i = 0; i < stride; ++i) prior[i] = up[i];
  return -1;
}

// `pixels` pixels of gray-alpha (`channels` 2) or RGBA (4) samples, each `sample_bytes` bytes
// (1, or 2 big-endian: only the high byte is read), as 8-bit RGB composited over white:
// c' = (c·a + 255·(255 − a) + 127) / 255, rounded down (the image plugin's rule, to_rgb).
UFORM_EXPORT void uform_png_over_white(const uint8_t* samples, int64_t pixels, int64_t channels, int64_t sample_bytes,
                                       uint8_t* out) {
  const int64_t step = channels * sample_bytes;
  for (int64_t p = 0; p < pixels; ++p) {
    const uint8_t* s = samples + p * step;
    const unsigned a = s[(channels - 1) * sample_bytes];
    const unsigned white = 255 * (255 - a) + 127;
    for (int c = 0; c < 3; ++c) {
      const unsigned v = s[(channels == 2 ? 0 : c) * sample_bytes];
      out[p * 3 + c] = static_cast<uint8_t>((v * a + white) / 255);
    }
  }
}
