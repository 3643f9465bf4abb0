// Private to the extension: what every binding file shares (Status ->
// Python exceptions, byte arrays that own their memory). Each component's
// bindings live in their own python/src/bind_<component>.cpp with a
// `void bind_<component>(nanobind::module_& m)` called from module.cpp.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "weightlift/device.h"
#include "weightlift/loader.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"
#include "weightlift/text.h"

namespace wl {
class Collective;
}

namespace wlpy {

namespace nb = nanobind;

// ---- errors -----------------------------------------------------------------

inline PyObject* g_corrupt_error = nullptr;    // weightlift.CorruptDataError(ValueError)
inline PyObject* g_cancelled_error = nullptr;  // weightlift.CancelledError(RuntimeError)

struct StatusError : std::exception {
  wl::Status status;
  std::string text;
  explicit StatusError(wl::Status s) : status(std::move(s)), text(status.to_string()) {}
  const char* what() const noexcept override { return text.c_str(); }
};

inline PyObject* exception_type(wl::Code code) {
  switch (code) {
    case wl::Code::kNotFound: return PyExc_FileNotFoundError;
    case wl::Code::kPermissionDenied: return PyExc_PermissionError;
    case wl::Code::kInvalidArgument: return PyExc_ValueError;
    case wl::Code::kCorruptData:
    case wl::Code::kOutOfRange: return g_corrupt_error;
    case wl::Code::kUnimplemented: return PyExc_NotImplementedError;
    case wl::Code::kIoError: return PyExc_OSError;
    case wl::Code::kUnavailable: return PyExc_ConnectionError;
    case wl::Code::kAlreadyExists: return PyExc_FileExistsError;
    case wl::Code::kCancelled: return g_cancelled_error;
    default: return PyExc_RuntimeError;
  }
}

[[noreturn]] inline void raise(wl::Status s) { throw StatusError(std::move(s)); }

// The engine's log lines as Python is given them: they name files and URLs,
// so each line is inert (text.h); a multi-line text stays one line per line.
inline std::string inert_lines(std::string_view text) {
  std::string out;
  for (size_t at = 0;;) {
    const size_t nl = text.find('\n', at);
    out += wl::inert(text.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at));
    if (nl == std::string_view::npos) return out;
    out += '\n';
    at = nl + 1;
  }
}
inline std::vector<std::string> inert_lines(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (const std::string& line : lines) out.push_back(wl::inert(line));
  return out;
}

template <class T>
T unwrap(wl::Result<T>&& r) {
  if (!r.ok()) raise(std::move(r).status());
  return std::move(r).value();
}

inline void check(wl::Status s) {
  if (!s.ok()) raise(std::move(s));
}

// ---- tensors ----------------------------------------------------------------

using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig>;

// A 1-D uint8 array over `bytes`, owning `owner` (a copy of the view's owner).
// CUDA memory crosses as a kDLCUDA array of that device (torch makes a CUDA
// tensor of it); pinned memory is host memory (kDLCPU).
inline Bytes bytes_array(std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
                         wl::Device device = wl::kCpu) {
  static uint8_t empty_byte = 0;
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  nb::capsule cap(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  const bool cuda = device.kind == wl::DeviceKind::kCuda;
  uint8_t* data =
      bytes.empty() && !cuda ? &empty_byte : reinterpret_cast<uint8_t*>(const_cast<std::byte*>(bytes.data()));
  size_t shape[1] = {bytes.size()};
  return Bytes(data, 1, shape, cap, nullptr, nb::dtype<uint8_t>(),
               cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? device.index : 0);
}

// ---- each component's bindings ----------------------------------------------
void bind_safetensors(nb::module_& m);  // bind_safetensors.cpp: the reader, writer and SafetensorError
void bind_hub(nb::module_& m);          // bind_hub.cpp: the Hugging Face Hub, ModelScope, load while downloading
void bind_dist(nb::module_& m);         // bind_dist.cpp: Collectives for distributed loading (torch.distributed, NCCL)
// The wl::Collective behind a weightlift._core.Collective object (engine option "collective").
wl::Collective* collective_from(nb::handle h);

void bind_gpu(nb::module_& m);  // bind_gpu.cpp: devices, one tensor to a device, device memory for tests

// ---- the engine, by seam (the options and plans, the loads, the sources, the policies) ----
void bind_engine(nb::module_& m);      // bind_engine.cpp: typed options, vocabularies, dry runs of plan_load
void bind_stream(nb::module_& m);      // bind_stream.cpp: the background load behind every iterator
void bind_load_into(nb::module_& m);   // bind_load_into.cpp: straight into the caller's memory
void bind_env(nb::module_& m);         // bind_env.cpp: listings and small reads through the Env
void bind_policies(nb::module_& m);    // bind_policies.cpp: prefetch, facts, names, dummy values, configs
void bind_read_ahead(nb::module_& m);  // bind_read_ahead.cpp: a load's reads started before the load
// The Env of a weightlift._core.ReadAhead (engine option "read_ahead").
wl::Env* read_ahead_env(nb::handle h);

}  // namespace wlpy
