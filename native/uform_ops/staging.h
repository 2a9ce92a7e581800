// A thread's scratch buffer, kept from task to task and grown as needed: the kernels' staged
// panels (kernels_avx2.cpp, kernels_avx512.cpp) and attention's transposed keys, gathered values
// and scores (attention.inc, attention_tiles.inc).
//
// Not a std::vector: a template instantiated in a kernel file is compiled under that file's
// target pragma, and it is a weak symbol, of which the linker keeps one copy for every file: a
// machine without those instructions would run it (std::vector<float>::assign did: SIGILL on
// AVX2). These functions are defined here, before any pragma, and are no template.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace uform {

struct Staging {
  void* data = nullptr;
  int64_t bytes = 0;
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() { std::free(data); }
  // Room for `need` bytes from a cache line's start; grown, it is new memory, all zeros (what
  // it held before is gone).
  void* fit(int64_t need) {
    if (need > bytes) {
      const int64_t rounded = (need + 63) / 64 * 64;
      std::free(data);
      data = std::aligned_alloc(64, size_t(rounded));
      if (data == nullptr) std::abort();  // scratch of a panel or a head: some MiB at most
      std::memset(data, 0, size_t(rounded));
      bytes = rounded;
    }
    return data;
  }
};

}  // namespace uform
