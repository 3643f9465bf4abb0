// Private: the dummy-weight launch behind wl::cuda::fill_dummy_device.
#pragma once

#include <cstdint>

#include "model/dummy_math.h"
#include "weightlift/status.h"

namespace wl::cuda::detail {
Status launch_fill_dummy(int kind, void* device_ptr, uint64_t numel, const dummy::Params& params, int device);
}  // namespace wl::cuda::detail
