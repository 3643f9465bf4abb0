// Copies a strided view into row-major order (private; used by the PyTorch and NumPy readers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "weightlift/tensor.h"

namespace wl {

namespace detail {
template <size_t E>
inline void copy_elems(std::byte* dst, const std::byte* src, int64_t n, int64_t stride) {
  for (int64_t j = 0; j < n; ++j)
    std::memcpy(dst + j * static_cast<int64_t>(E), src + j * stride * static_cast<int64_t>(E), E);
}
}  // namespace detail

// Element (offset + sum(i_k * strides[k])) of `base` goes to dst in row-major
// order. Strides and offset are in elements of `esize` bytes. REQUIRES: the
// caller validated that every element lies inside `base`.
inline void strided_copy(const std::byte* base, size_t esize, uint64_t offset, const Shape& sz,
                         const std::vector<int64_t>& st, std::byte* dst) {
  if (shape_numel(sz) == 0) return;
  size_t k = sz.size();
  int64_t block = 1;
  // Trailing dims that are contiguous in the source form one memcpy block.
  while (k > 0 && (sz[k - 1] == 1 || st[k - 1] == block)) {
    block *= sz[k - 1];
    --k;
  }
  const size_t block_bytes = static_cast<size_t>(block) * esize;
  if (k == 0) {
    std::memcpy(dst, base + offset * esize, block_bytes);
    return;
  }
  // Small elements with no contiguous block: the innermost outer dim is walked with a typed loop.
  const bool elementwise = block == 1 && (esize == 1 || esize == 2 || esize == 4 || esize == 8);
  const size_t outer = elementwise ? k - 1 : k;
  std::vector<int64_t> idx(outer, 0);
  uint64_t src = offset;
  while (true) {
    if (elementwise) {
      int64_t n = sz[k - 1], s = st[k - 1];
      const std::byte* from = base + src * esize;
      switch (esize) {
        case 1: detail::copy_elems<1>(dst, from, n, s); break;
        case 2: detail::copy_elems<2>(dst, from, n, s); break;
        case 4: detail::copy_elems<4>(dst, from, n, s); break;
        default: detail::copy_elems<8>(dst, from, n, s); break;
      }
      dst += static_cast<size_t>(n) * esize;
    } else {
      std::memcpy(dst, base + src * esize, block_bytes);
      dst += block_bytes;
    }
    if (outer == 0) return;
    size_t j = outer;
    while (true) {
      --j;
      ++idx[j];
      src += static_cast<uint64_t>(st[j]);
      if (idx[j] < sz[j]) break;
      src -= static_cast<uint64_t>(st[j] * sz[j]);
      idx[j] = 0;
      if (j == 0) return;
    }
  }
}

}  // namespace wl
