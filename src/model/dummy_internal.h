// Private: the host fill of one dummy-weight kind, shared by fill_dummy() and
// the fake GPU backend's kernel (src/gpu/fake.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/dummy_math.h"

namespace wl::dummy {
// Elements [begin, end) of a tensor of `kind` (dummy::Kind) at `base`.
void fill_host(int kind, std::byte* base, uint64_t begin, uint64_t end, const Params& p);
}  // namespace wl::dummy
