// weightlift/dtype.h: element types of every format we read.
//
// The first block is exactly safetensors' Dtype, in safetensors' own order
// (by alignment; the writer sorts tensors by this order, descending). The
// second block holds PyTorch / NumPy types that safetensors cannot store.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace wl {

enum class DType : uint8_t {
  BOOL = 0,
  F4,       // float4 e2m1, two per byte (4 bits)
  F6_E2M3,  // 6 bits
  F6_E3M2,  // 6 bits
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,  // float8_e4m3fn
  F8_E8M0,  // float8_e8m0fnu (MX scales)
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,  // complex64
  F64,
  I64,
  U64,
  // Not storable in safetensors:
  C128,  // complex128
  C32,   // complex32 (torch.chalf)
  // Storable in safetensors like the first block (listed here to keep the numbering).
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  kCount,
};

inline constexpr int kDTypeCount = static_cast<int>(DType::kCount);

// Bits per element (4 for F4, 6 for F6_*, 8 * bytes otherwise).
int dtype_bits(DType t);
// Whole bytes per element; 0 for sub-byte types (F4, F6_*).
int dtype_size(DType t);
// Canonical name as safetensors spells it ("BF16", "F8_E4M3").
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; nullopt when unknown. Case-sensitive, as safetensors is.
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType t);        // floating kinds, float8 and sub-byte floats included
bool dtype_in_safetensors(DType t);  // false for C128 and C32

// Byte size of `numel` elements; nullopt when the bit count overflows or is not whole bytes.
std::optional<uint64_t> dtype_nbytes(DType t, uint64_t numel);

}  // namespace wl
