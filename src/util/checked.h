// Overflow-checked arithmetic for sizes taken from untrusted files.
#pragma once

#include <cstdint>
#include <span>

namespace wl {

inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Product of a shape; false on overflow or a negative dimension.
inline bool checked_numel(std::span<const int64_t> shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || !checked_mul(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

}  // namespace wl
