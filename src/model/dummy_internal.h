// Private: what a dummy-weight fill draws and the host fill of one kind,
// shared by fill_dummy(), the device fill (src/gpu/dummy_fill.cpp) and the
// fake GPU backend's kernel (src/gpu/fake.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "model/dummy_math.h"
#include "weightlift/dtype.h"
#include "weightlift/dummy.h"
#include "weightlift/status.h"

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
