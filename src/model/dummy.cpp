// Dummy weights on the CPU (see weightlift/dummy.h; the math is in dummy_kernel.h).
#include "weightlift/dummy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "weightlift/dummy_kernel.h"

namespace wl {
namespace {

using dummy::Kind;

std::optional<Kind> kind_of(DType t) {
  switch (t) {
    case DType::F32: return dummy::kF32;
    case DType::F16: return dummy::kF16;
    case DType::BF16: return dummy::kBF16;
    case DType::F8_E4M3: return dummy::kE4M3;
    case DType::F8_E5M2: return dummy::kE5M2;
    case DType::F64: return dummy::kF64;
    default: return std::nullopt;
  }
}

// Float kinds we do not generate (the reference has no uniform_ for them either).
bool unsupported_float(DType t) {
  return dtype_is_float(t) && !kind_of(t) && t != DType::C64 && t != DType::C128 && t != DType::C32;
}

dummy::Params make_params(Kind kind, double low, double high, uint64_t seed) {
  dummy::Params p{};
  p.low32 = static_cast<float>(low);
  p.high32 = static_cast<float>(high);
  p.range32 = p.high32 - p.low32;
  p.low64 = low;
  p.high64 = high;
  p.range64 = high - low;
  p.seed = seed;
  p.low16 = kind == dummy::kBF16 ? dummy::f32_to_bf16(p.low32) : dummy::f32_to_f16(p.low32);
  return p;
}

// half -> e4m3 for every half code (the host's fast path; same values as
// dummy::f32_to_e4m3(f16_to_f32(h)), which the kernel computes directly).
const uint8_t* e4m3_from_half_table() {
  static const auto table = [] {
    auto t = std::make_unique<uint8_t[]>(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = dummy::f32_to_e4m3(dummy::f16_to_f32(static_cast<uint16_t>(h)));
    return t;
  }();
  return table.get();
}

// Elements [begin, end) of a tensor of kind K (a template, so the per-element
// branches on the kind fold away).
template <int K>
void fill_range_k(std::byte* base, uint64_t begin, uint64_t end, const dummy::Params& p) {
  if constexpr (K == dummy::kF64) {
    for (uint64_t i = begin; i < end;) {
      dummy::U4 w = dummy::philox4x32(i >> 1, p.seed);
      for (uint64_t j = i & 1; j < 2 && i < end; ++j, ++i) {
        double v = dummy::uniform_f64(w.v[2 * j], w.v[2 * j + 1], p.low64, p.range64);
        if (!(v < p.high64)) v = p.low64;
        std::memcpy(base + i * 8, &v, 8);
      }
    }
  } else {
    [[maybe_unused]] const uint8_t* e4m3 = K == dummy::kE4M3 ? e4m3_from_half_table() : nullptr;
    using Out = std::conditional_t<K == dummy::kF32, uint32_t,
                                   std::conditional_t<K == dummy::kF16 || K == dummy::kBF16, uint16_t, uint8_t>>;
    auto element = [&](uint32_t word) -> Out {
      if constexpr (K == dummy::kE4M3)
        return e4m3[dummy::element_from_word(dummy::kF16, word, p)];
      else
        return static_cast<Out>(dummy::element_from_word(K, word, p));
    };
    uint64_t i = begin;
    // Head up to a block boundary, one element at a time.
    for (; i < end && (i & 3); ++i) {
      Out v = element(dummy::philox4x32(i >> 2, p.seed).v[i & 3]);
      std::memcpy(base + i * sizeof(Out), &v, sizeof(Out));
    }
    // Whole groups of kLanes blocks: independent Philox chains in lockstep,
    // which the CPU overlaps (one chain alone is latency-bound).
    constexpr int kLanes = 8;
    uint32_t words[kLanes * 4];
    while (end - i >= 4 * kLanes) {
      dummy::philox4x32_lanes<kLanes>(i >> 2, p.seed, words);
      Out out[kLanes * 4];
      for (int n = 0; n < kLanes * 4; ++n) out[n] = element(words[n]);
      std::memcpy(base + i * sizeof(Out), out, sizeof out);
      i += 4 * kLanes;
    }
    // Tail.
    for (; i < end; ++i) {
      Out v = element(dummy::philox4x32(i >> 2, p.seed).v[i & 3]);
      std::memcpy(base + i * sizeof(Out), &v, sizeof(Out));
    }
  }
}

}  // namespace

namespace dummy {
void fill_host(int kind, std::byte* base, uint64_t begin, uint64_t end, const dummy::Params& p) {
  switch (kind) {
    case dummy::kF32: return fill_range_k<dummy::kF32>(base, begin, end, p);
    case dummy::kF16: return fill_range_k<dummy::kF16>(base, begin, end, p);
    case dummy::kBF16: return fill_range_k<dummy::kBF16>(base, begin, end, p);
    case dummy::kE4M3: return fill_range_k<dummy::kE4M3>(base, begin, end, p);
    case dummy::kE5M2: return fill_range_k<dummy::kE5M2>(base, begin, end, p);
    case dummy::kF64: return fill_range_k<dummy::kF64>(base, begin, end, p);
  }
}
}  // namespace dummy

namespace {
using dummy::fill_host;

Status check_bounds(double low, double high) {
  if (!std::isfinite(low) || !std::isfinite(high))
    return Status::InvalidArgument(fmt::format("dummy weight bounds must be finite, got [{}, {})", low, high));
  if (low > high)
    return Status::InvalidArgument(fmt::format("dummy weight bounds need low <= high, got [{}, {})", low, high));
  return Status();
}

}  // namespace

namespace dummy {
Result<std::optional<Fill>> plan_fill(DType dtype, const DummyOptions& o) {
  WL_RETURN_IF_ERROR(check_bounds(o.low, o.high));
  auto kind = kind_of(dtype);
  if (!kind) {
    if (unsupported_float(dtype))
      return Status::Unimplemented(fmt::format("dummy weights of dtype {} are not supported", dtype_name(dtype)));
    return std::optional<Fill>();
  }
  return std::optional<Fill>(Fill{*kind, make_params(*kind, o.low, o.high, o.seed)});
}
}  // namespace dummy

bool dummy_fills(DType dtype) { return kind_of(dtype).has_value(); }

uint64_t dummy_element_bits(DType dtype, uint64_t index, double low, double high, uint64_t seed) {
  auto kind = kind_of(dtype);
  if (!kind) return 0;
  dummy::Params p = make_params(*kind, low, high, seed);
  if (*kind == dummy::kF64) {
    dummy::U4 w = dummy::philox4x32(index >> 1, seed);
    uint64_t j = index & 1;
    double v = dummy::uniform_f64(w.v[2 * j], w.v[2 * j + 1], p.low64, p.range64);
    if (!(v < p.high64)) v = p.low64;
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    return bits;
  }
  dummy::U4 w = dummy::philox4x32(index >> 2, seed);
  return dummy::element_from_word(*kind, w.v[index & 3], p);
}

Status fill_dummy(DType dtype, std::span<std::byte> bytes, uint64_t numel, const DummyOptions& o) {
  WL_ASSIGN_OR_RETURN(std::optional<dummy::Fill> fill, dummy::plan_fill(dtype, o));
  if (!fill) return Status();  // integer, bool and complex tensors stay as they are
  auto need = dtype_nbytes(dtype, numel);
  if (!need || *need > bytes.size())
    return Status::OutOfRange(
        fmt::format("a buffer of {} bytes cannot hold {} elements of {}", bytes.size(), numel, dtype_name(dtype)));
  const int kind = fill->kind;
  const dummy::Params& p = fill->params;
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  uint64_t threads = o.threads > 0 ? static_cast<uint64_t>(o.threads) : hw;
  // At least 4 Ki elements per thread; chunk edges on whole Philox blocks.
  threads = std::max<uint64_t>(1, std::min<uint64_t>(threads, numel / 4096 + 1));
  if (threads == 1) {
    fill_host(kind, bytes.data(), 0, numel, p);
    return Status();
  }
  uint64_t per = (numel / threads + 3) & ~uint64_t{3};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (uint64_t t = 0; t < threads; ++t) {
    // The last thread takes everything left: per * threads can fall short of numel.
    uint64_t b = std::min(numel, t * per), e = t + 1 == threads ? numel : std::min(numel, b + per);
    if (b >= e) break;
    pool.emplace_back([&, b, e] { fill_host(kind, bytes.data(), b, e, p); });
  }
  for (auto& th : pool) th.join();
  return Status();
}

Status fill_dummy(Tensor& tensor, const DummyOptions& options) {
  return fill_dummy(tensor.dtype(), tensor.mutable_bytes(), tensor.numel(), options);
}

Result<Tensor> dummy_tensor(DType dtype, Shape shape, const DummyOptions& options) {
  WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(dtype, std::move(shape)));
  if (!dummy_fills(dtype)) std::fill(t.mutable_bytes().begin(), t.mutable_bytes().end(), std::byte{0});
  WL_RETURN_IF_ERROR(fill_dummy(t, options));
  return t;
}

}  // namespace wl
