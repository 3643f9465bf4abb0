// weightlift/dummy.h: dummy weights (vLLM initialize_dummy_weights /
// initialize_single_dummy_weight) for benchmarking without reading bytes.
//
// Values are uniform in [low, high) (default +-1e-3). Every tensor is seeded
// with the same `seed`, so a value depends only on the seed, its element
// index and the dtype; shards of one tensor and tensors of equal size agree.
// The generator is counter-based (Philox4x32-10, key = seed): element i of a
// 32-bit-drawn dtype is word i%4 of Philox(counter = i/4); F64 uses the two
// words (2*(i%2), 2*(i%2)+1) of counter i/2. Any thread count, and the CUDA
// kernel (src/cuda), produce the same bytes.
//   F32:       u = (w >> 8) * 2^-24,  v = fl32(low + (high - low) * u)
//   F16, BF16: the F32 value rounded to nearest-even
//   F8_E4M3, F8_E5M2: drawn as F16 then rounded to nearest-even (like the
//              reference, which draws fp8 in float16 and converts; rounding
//              can reach `high`)
//   F64:       u = ((w0 << 21) | (w1 >> 11)) * 2^-53, v = low + (high - low) * u
// A value that rounds to `high` (or above) becomes `low`, keeping [low, high).
// Integer, bool and complex tensors are left untouched (the reference skips
// non-floating tensors); other float kinds (F4, F6, F8_E8M0, FNUZ) are
// kUnimplemented.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "weightlift/dtype.h"
#include "weightlift/dummy_kernel.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

struct DummyOptions {
  double low = -1e-3;
  double high = 1e-3;
  uint64_t seed = 1234;
  int threads = 0;  // 0: hardware concurrency
};

// True when fill_dummy writes values of this dtype (else it leaves them).
bool dummy_fills(DType dtype);

// Fills `numel` elements of `dtype` at `bytes` (host memory). Checks that
// low <= high, both finite, and that `bytes` holds numel elements.
Status fill_dummy(DType dtype, std::span<std::byte> bytes, uint64_t numel, const DummyOptions& options = {});
Status fill_dummy(Tensor& tensor, const DummyOptions& options = {});
// A new host tensor of `dtype` and `shape` filled by fill_dummy; the kinds
// fill_dummy leaves untouched (integers, bool, complex) are zeroed.
Result<Tensor> dummy_tensor(DType dtype, Shape shape, const DummyOptions& options = {});
// The brief's signature, for the engine.
inline Status fill_dummy(Tensor& tensor, double low, double high, uint64_t seed, int threads) {
  return fill_dummy(tensor, DummyOptions{low, high, seed, threads});
}

// Element i alone, as raw bits (for tests and spot checks): the F32 value's
// bits, the F16/BF16/F8 code, or the F64 bits.
uint64_t dummy_element_bits(DType dtype, uint64_t index, double low, double high, uint64_t seed);

}  // namespace wl

// ---- what a fill draws, for the device fills (gpu.h, the fake backend) ----
namespace wl::dummy {
// The kind (dummy::Kind) and parameters a fill of `dtype` draws with; nullopt
// for the dtypes a fill leaves untouched (integers, bool, complex). Errors:
// bounds not finite or low > high; float kinds without a generator.
struct Fill {
  int kind = 0;
  Params params{};
};
Result<std::optional<Fill>> plan_fill(DType dtype, const DummyOptions& options);

// Elements [begin, end) of a tensor of `kind` (dummy::Kind) at `base`.
void fill_host(int kind, std::byte* base, uint64_t begin, uint64_t end, const Params& p);
}  // namespace wl::dummy
