// weightlift._core, GPU part (weightlift/gpu.h): device detection, warm-up
// and costs, device memory, and the helpers tests use. The options'
// "device"/"gds" become a destination through gpu::destination_for
// (bind_engine.cpp).
// Device tensors cross as kDLCUDA arrays that own their memory (bindings.h).
#include <memory>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/dummy.h"
#include "weightlift/gpu.h"

namespace wlpy {

using namespace nb::literals;

void bind_gpu(nb::module_& m) {
  m.def("gpu_device_count", [] { return wl::gpu::device_count(); });
  m.def("gpu_unavailable_reason", [] { return wl::gpu::unavailable_reason(); });
  m.def("gpu_backend_name", [] { return wl::gpu::backend_name(); });
  // (free, total) bytes of a CUDA device's memory (cudaMemGetInfo; the fake's own accounting).
  m.def(
      "gpu_memory_info",
      [](int device) {
        wl::gpu::MemoryInfo info = unwrap(wl::gpu::memory_info(device));
        return nb::make_tuple(info.free_bytes, info.total_bytes);
      },
      "device"_a);
  // What the first device load of this process paid once (gpu.h ProcessCosts), in ms.
  m.def("gpu_process_costs", [] {
    wl::gpu::ProcessCosts c = wl::gpu::process_costs();
    nb::dict d;
    d["detect_ms"] = c.detect_ms, d["kernels_ms"] = c.kernels_ms, d["context_ms"] = c.context_ms;
    d["ring_ms"] = c.ring_ms, d["ring_grow_ms"] = c.ring_grow_ms, d["ring_bytes"] = c.ring_bytes;
    d["copier_ms"] = c.copier_ms;
    d["gds_probe_ms"] = c.gds_probe_ms, d["cufile_ms"] = c.cufile_ms;
    d["first_allocation_ms"] = c.first_allocation_ms, d["warm_up"] = c.warm_up;
    d["text"] = c.to_string();
    return d;
  });
  // Starts the first device load's one-time work on a background thread (gpu.h warm_up).
  m.def("gpu_warm_up", [](const std::string& device) {
    wl::Device d = unwrap(wl::parse_device(device));
    nb::gil_scoped_release nogil;
    wl::gpu::warm_up(d);
  });
  // A host copy of a 1-D uint8 array of device memory (kDLCUDA; host arrays are copied too).
  m.def("gpu_copy_to_host", [](nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig> a) {
    const bool cuda = a.device_type() == nb::device::cuda::value;
    wl::Device d = cuda ? wl::Device{wl::DeviceKind::kCuda, a.device_id()} : wl::kCpu;
    const auto n = static_cast<size_t>(a.shape(0));
    wl::TensorView v(wl::DType::U8, {static_cast<int64_t>(n)},
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(a.data()), n), nullptr, d);
    auto host = std::make_shared<wl::Buffer>(unwrap(wl::Buffer::allocate(std::max<size_t>(n, 1))));
    {
      nb::gil_scoped_release nogil;
      check(wl::gpu::copy_to_host(v, host->span().first(n)));
    }
    return bytes_array(std::span<const std::byte>(host->data(), n), host);
  });
  // Dummy weights filled in device memory (the CUDA kernel; gpu.h fill_dummy_device).
  m.def(
      "fill_dummy_device",
      [](const std::string& dtype, uintptr_t ptr, uint64_t numel, double low, double high, uint64_t seed, int device) {
        auto dt = wl::dtype_from_name(dtype);
        if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'"));
        nb::gil_scoped_release nogil;
        check(wl::gpu::fill_dummy_device(*dt, reinterpret_cast<void*>(ptr), numel, wl::DummyOptions{low, high, seed, 0},
                                         device));
      },
      "dtype"_a, "ptr"_a, "numel"_a, "low"_a, "high"_a, "seed"_a, "device"_a);
  // (address, kDLCUDA array owning it) of n bytes of device memory (tests: a stand-in for a parameter).
  m.def("gpu_empty", [](uint64_t n, int device) {
    auto buf = std::make_shared<wl::gpu::DeviceBuffer>(unwrap(wl::gpu::DeviceBuffer::allocate(n, device)));
    auto ptr = reinterpret_cast<uintptr_t>(buf->data());
    return nb::make_tuple(ptr, bytes_array(std::span<const std::byte>(static_cast<const std::byte*>(buf->data()), n),
                                           buf, wl::Device{wl::DeviceKind::kCuda, device}));
  });
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
