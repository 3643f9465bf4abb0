// weightlift._core, GPU part (weightlift/gpu.h): device detection, the
// "device"/"gds" engine options of Stream, one tensor read to a device.
// Device tensors cross as kDLCUDA arrays that own their memory (bindings.h).
#include <memory>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/gpu.h"

namespace wlpy {

using namespace nb::literals;

std::shared_ptr<void> gpu_destination_option(const nb::dict& engine, wl::LoadOptions& o) {
  std::string device = "cpu", gds = "auto";
  if (engine.contains("device")) device = nb::cast<std::string>(engine["device"]);
  if (engine.contains("gds")) gds = nb::cast<std::string>(engine["gds"]);
  wl::Device d = unwrap(wl::parse_device(device));
  auto g = wl::toggle_from_name(gds);
  if (!g) raise(wl::Status::InvalidArgument("gds must be auto, on or off, not '" + gds + "'"));
  if (d.kind == wl::DeviceKind::kCpu) return nullptr;
  check(wl::gpu::check_device(d));
  std::unique_ptr<wl::gpu::DeviceDestination> dest =
      d.kind == wl::DeviceKind::kCuda ? unwrap(wl::gpu::cuda_destination(d, {.gds = *g}))
                                      : unwrap(wl::gpu::pinned_destination());
  o.destination = dest.get();
  return std::shared_ptr<wl::gpu::DeviceDestination>(std::move(dest));
}

void bind_gpu(nb::module_& m) {
  m.def("gpu_device_count", [] { return wl::gpu::device_count(); });
  m.def("gpu_unavailable_reason", [] { return wl::gpu::unavailable_reason(); });
  m.def("gpu_backend_name", [] { return wl::gpu::backend_name(); });
  // (dtype, shape, bytes) of nbytes at `offset` of `path`, on `device`.
  m.def(
      "read_to_device",
      [](const std::string& path, uint64_t offset, const std::string& dtype, const wl::Shape& shape,
         const std::string& device) {
        auto dt = wl::dtype_from_name(dtype);
        if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'").with_file(path));
        wl::Device d = unwrap(wl::parse_device(device));
        wl::TensorView v;
        {
          nb::gil_scoped_release nogil;
          auto f = unwrap(wl::Env::Default()->open(path, {.mode = wl::FileMode::kPread}));
          check(wl::gpu::check_device(d));
          v = unwrap(wl::gpu::read_to_device(*f, offset, *dt, shape, d));
        }
        return nb::make_tuple(dtype, nb::cast(v.shape()), bytes_array(v.bytes(), v.owner(), v.device()));
      },
      "path"_a, "offset"_a, "dtype"_a, "shape"_a, "device"_a);
  // nbytes at device address `ptr` on `device` copied to host (bytes): for
  // checking what the engine wrote into memory the caller holds on a device
  // (load_into's CUDA targets; on the fake backend too).
  m.def(
      "device_bytes",
      [](uintptr_t ptr, uint64_t nbytes, const std::string& device) {
        wl::Device d = unwrap(wl::parse_device(device));
        std::string out(nbytes, '\0');
        {
          nb::gil_scoped_release nogil;
          check(wl::gpu::check_device(d));
          wl::TensorView v(wl::DType::U8, wl::Shape{static_cast<int64_t>(nbytes)},
                           std::span<const std::byte>(reinterpret_cast<const std::byte*>(ptr), nbytes), nullptr, d);
          check(wl::gpu::copy_to_host(v, std::as_writable_bytes(std::span<char>(out.data(), out.size()))));
        }
        return nb::bytes(out.data(), out.size());
      },
      "ptr"_a, "nbytes"_a, "device"_a);
}

}  // namespace wlpy
