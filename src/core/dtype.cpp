#include "weightlift/dtype.h"

#include <array>

#include "util/checked.h"

namespace wl {
namespace {

struct Info {
  std::string_view name;
  int bits;
  bool is_float;
};

constexpr std::array<Info, kDTypeCount> kInfo = {{
    {"BOOL", 8, false},  {"F4", 4, true},      {"F6_E2M3", 6, true},     {"F6_E3M2", 6, true},     {"U8", 8, false},
    {"I8", 8, false},    {"F8_E5M2", 8, true}, {"F8_E4M3", 8, true},     {"F8_E8M0", 8, true},     {"I16", 16, false},
    {"U16", 16, false},  {"F16", 16, true},    {"BF16", 16, true},       {"I32", 32, false},       {"U32", 32, false},
    {"F32", 32, true},   {"C64", 64, true},    {"F64", 64, true},        {"I64", 64, false},       {"U64", 64, false},
    {"C128", 128, true}, {"C32", 32, true},    {"F8_E4M3FNUZ", 8, true}, {"F8_E5M2FNUZ", 8, true},
}};

const Info& info(DType t) { return kInfo[static_cast<size_t>(t) < kInfo.size() ? static_cast<size_t>(t) : 0]; }

}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
int dtype_size(DType t) { return info(t).bits % 8 == 0 ? info(t).bits / 8 : 0; }
std::string_view dtype_name(DType t) { return info(t).name; }
bool dtype_is_float(DType t) { return info(t).is_float; }
bool dtype_in_safetensors(DType t) {
  return static_cast<int>(t) <= static_cast<int>(DType::U64) || t == DType::F8_E4M3FNUZ || t == DType::F8_E5M2FNUZ;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (kInfo[i].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

std::optional<uint64_t> dtype_nbytes(DType t, uint64_t numel) {
  uint64_t bits = 0;
  if (!checked_mul(numel, static_cast<uint64_t>(dtype_bits(t)), &bits)) return std::nullopt;
  if (bits % 8 != 0) return std::nullopt;
  return bits / 8;
}

}  // namespace wl
