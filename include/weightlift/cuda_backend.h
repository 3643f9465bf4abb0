// weightlift/cuda_backend.h: the optional GPU backend.
//
// The CUDA code lives in libweightlift_cuda.so (built from src/cuda/ when a
// CUDA toolkit is found). It is loaded on first use with dlopen() from
// $WEIGHTLIFT_CUDA_LIBRARY, next to the running binary or library (., ../lib),
// or the loader's search path; devices are counted with cudaGetDeviceCount.
// Without the library, a driver or a GPU every function here fails with
// kUnavailable (or reports 0 devices) and the CPU paths are unaffected.
// Thread-safety: loading is once-only and thread-safe; a DeviceBuffer is
// used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "weightlift/dtype.h"
#include "weightlift/dummy.h"
#include "weightlift/status.h"

namespace wl::cuda {

// Devices usable through the backend; 0 when it cannot be loaded.
int device_count();
// Why the backend is unusable ("" when it is usable).
std::string unavailable_reason();

// Device memory; freed by the destructor. Move-only.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(size_t bytes, int device = 0);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  // Whole-buffer copies; sizes must match.
  Status copy_to_host(std::span<std::byte> dst) const;
  Status copy_from_host(std::span<const std::byte> src);

 private:
  void reset();
  void* ptr_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

// fill_dummy() for device memory: the same bytes as the CPU fill.
Status fill_dummy_device(DType dtype, void* device_ptr, uint64_t numel, const DummyOptions& options = {},
                         int device = 0);
inline Status fill_dummy_device(DType dtype, DeviceBuffer& buffer, uint64_t numel, const DummyOptions& options = {}) {
  if (auto need = dtype_nbytes(dtype, numel); !need || *need > buffer.size())
    return Status::OutOfRange("the device buffer is smaller than the tensor");
  return fill_dummy_device(dtype, buffer.data(), numel, options, buffer.device());
}

}  // namespace wl::cuda
