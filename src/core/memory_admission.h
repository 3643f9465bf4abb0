// Private: how many bytes a large host allocation may take now, asked by
// Buffer::allocate before it allocates (sizes often come from a file's or a
// server's claims). Core declares the question; the system component, which
// knows the machine (MemAvailable within the cgroup limit, system.h),
// answers it (src/system/system_info.cpp). An error lets the allocation go
// ahead unchecked.
#pragma once

#include <cstdint>

#include "weightlift/status.h"

namespace wl {

Result<uint64_t> memory_available_for_buffers();

}  // namespace wl
