// fill_dummy() for device memory (gpu.h): the fill planned on the host as for
// host memory (dummy.h's plan_fill), drawn by the backend's kernel.
#include <fmt/format.h>

#include "gpu/api.h"
#include "weightlift/dummy.h"
#include "weightlift/gpu.h"

namespace wl::gpu {

Status fill_dummy_device(DType dtype, void* device_ptr, uint64_t numel, const DummyOptions& options, int device) {
  WL_ASSIGN_OR_RETURN(std::optional<dummy::Fill> fill, dummy::plan_fill(dtype, options));
  if (!fill) return Status();  // integer, bool and complex tensors stay as they are
  return launch_fill_dummy(fill->kind, device_ptr, numel, fill->params, device);
}

Status fill_dummy_device(DType dtype, void* device_ptr, uint64_t numel) {
  return fill_dummy_device(dtype, device_ptr, numel, DummyOptions{});
}

Status fill_dummy_device(DType dtype, DeviceBuffer& buffer, uint64_t numel, const DummyOptions& options) {
  if (auto need = dtype_nbytes(dtype, numel); !need || *need > buffer.size())
    return Status::OutOfRange("the device buffer is smaller than the tensor");
  return fill_dummy_device(dtype, buffer.data(), numel, options, buffer.device());
}

}  // namespace wl::gpu
