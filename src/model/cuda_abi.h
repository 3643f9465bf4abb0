// The C interface between the core and libweightlift_cuda.so (src/cuda/),
// which the core dlopen()s at run time. Private header; both sides include it.
// Bump kWlCudaAbiVersion on any change.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/dummy_math.h"

extern "C" {

inline constexpr int kWlCudaAbiVersion = 1;

// Every function returns 0 on success, or a CUDA error code with a message
// written to err (NUL-terminated, at most errlen bytes).
struct WlCudaApi {
  int abi_version;
  // Number of usable devices (0 when there is no driver or no GPU).
  int (*device_count)(void);
  int (*alloc)(int device, size_t bytes, void** out, char* err, size_t errlen);
  int (*release)(int device, void* ptr);
  int (*copy_to_host)(int device, void* dst, const void* src, size_t bytes, char* err, size_t errlen);
  int (*copy_to_device)(int device, void* dst, const void* src, size_t bytes, char* err, size_t errlen);
  // Fills numel elements of `kind` (wl::dummy::Kind) at device pointer `ptr`
  // and waits for the kernel to finish.
  int (*fill_dummy)(int device, int kind, void* ptr, uint64_t numel, const wl::dummy::Params* params, char* err,
                    size_t errlen);
};

// The one symbol the core looks up.
const WlCudaApi* wl_cuda_api(void);
}
