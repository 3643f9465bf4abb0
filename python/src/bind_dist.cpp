// Distributed loading from Python: wl::Collective over the caller's
// torch.distributed process group (a trampoline into a Python object, see
// weightlift/_distributed.py) or over an NCCL communicator handed in.
//
// The trampoline: the engine calls the Collective from its own thread with
// the GIL released; each call takes the GIL only for the Python call, and the
// engine's buffers cross as torch tensors over that memory (DLPack, no copy,
// CPU or CUDA as the collective's device says), valid only during the call.
// A Python exception fails the call (kAborted, with the exception's text) and
// every later call: the group is then unusable.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include "bindings.h"
#include "weightlift/collective.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlpy {

namespace {

// A torch tensor over n bytes at p (no owner: the caller keeps the memory alive).
nb::object tensor_over(const std::byte* p, uint64_t n, wl::Device d) {
  size_t shape[1] = {static_cast<size_t>(n)};
  const int type = d.host_accessible() ? nb::device::cpu::value : nb::device::cuda::value;
  nb::ndarray<nb::pytorch, uint8_t, nb::ndim<1>> a(const_cast<std::byte*>(p), 1, shape, nb::handle(), nullptr,
                                                   nb::dtype<uint8_t>(), type, d.host_accessible() ? 0 : d.index);
  return nb::cast(a, nb::rv_policy::reference);
}

class PyCollective final : public wl::Collective {
 public:
  // impl: an object with attributes rank, world_size, device ("cpu",
  // "cuda:N") and the methods of weightlift._distributed.TorchCollective.
  explicit PyCollective(nb::object impl) : impl_(std::move(impl)) {
    rank_ = nb::cast<int>(impl_.attr("rank"));
    world_ = nb::cast<int>(impl_.attr("world_size"));
    device_ = unwrap(wl::parse_device(nb::cast<std::string>(impl_.attr("device"))));
    if (world_ < 1 || rank_ < 0 || rank_ >= world_)
      raise(wl::Status::InvalidArgument(fmt::format("collective rank {} is outside [0, {})", rank_, world_)));
  }
  ~PyCollective() override {
    nb::gil_scoped_acquire gil;
    impl_.reset();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  wl::Device device() const override { return device_; }

  wl::Status all_gather(std::byte* buf, uint64_t block) override {
    return call("all_gather", [&] {
      impl_.attr("all_gather")(tensor_over(buf, block * static_cast<uint64_t>(world_), device_), block);
    });
  }
  wl::Status broadcast(std::byte* buf, uint64_t n, int root) override {
    return call("broadcast", [&] { impl_.attr("broadcast")(tensor_over(buf, n, device_), root); });
  }
  wl::Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    std::vector<std::string> out;
    wl::Status s = call("all_gather_strings", [&] {
      nb::object r = impl_.attr("all_gather_strings")(nb::bytes(mine.data(), mine.size()));
      for (nb::handle item : r) {
        nb::bytes b = nb::cast<nb::bytes>(item);
        out.emplace_back(b.c_str(), b.size());
      }
    });
    if (!s.ok()) return s;
    return out;
  }
  void abort(const wl::Status& why) override {
    broken_ = true;
    nb::gil_scoped_acquire gil;
    try {
      impl_.attr("abort")(why.to_string());
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("weightlift: Collective.abort");
    }
  }
  wl::Result<std::shared_ptr<std::byte>> allocate(uint64_t n) override {
    std::shared_ptr<std::byte> out;
    wl::Status s = call("allocate", [&] {
      nb::object t = impl_.attr("allocate")(n);
      auto* p = reinterpret_cast<std::byte*>(nb::cast<uintptr_t>(t.attr("data_ptr")()));
      auto* keep = new nb::object(std::move(t));
      out = std::shared_ptr<std::byte>(p, [keep](std::byte*) {
        nb::gil_scoped_acquire gil;
        delete keep;
      });
    });
    if (!s.ok()) return s;
    return out;
  }
  wl::Status copy(std::byte* dst, wl::Device dd, const std::byte* src, wl::Device sd, uint64_t n) override {
    if (n == 0) return wl::Status();
    return call("copy", [&] { impl_.attr("copy")(tensor_over(dst, n, dd), tensor_over(src, n, sd)); });
  }

 private:
  template <class F>
  wl::Status call(const char* what, F&& f) {
    if (broken_)
      return wl::Status::Aborted(fmt::format("rank {} of {}: the process group failed earlier", rank_, world_));
    nb::gil_scoped_acquire gil;
    try {
      f();
      return wl::Status();
    } catch (nb::python_error& e) {
      broken_ = true;
      return wl::Status::Aborted(
          fmt::format("rank {} of {}: torch.distributed {} failed: {}", rank_, world_, what, e.what()));
    } catch (const nb::cast_error&) {
      broken_ = true;
      return wl::Status::Aborted(fmt::format("rank {} of {}: {} returned the wrong type", rank_, world_, what));
    }
  }

  nb::object impl_;
  int rank_ = 0, world_ = 1;
  wl::Device device_;
  std::atomic<bool> broken_{false};
};

}  // namespace

wl::Collective* collective_from(nb::handle h) { return nb::cast<wl::Collective*>(h); }

void bind_dist(nb::module_& m) {
  nb::class_<wl::Collective>(m, "Collective",
                             "A rank's handle on its group for distributed loading (pass it as engine option "
                             "'collective'); made by python_collective() or nccl_collective().")
      .def_prop_ro("rank", &wl::Collective::rank)
      .def_prop_ro("world_size", &wl::Collective::world_size)
      .def_prop_ro("device", [](const wl::Collective& c) { return c.device().to_string(); });

  m.def(
      "python_collective",
      [](nb::object impl) -> std::unique_ptr<wl::Collective> {
        return std::make_unique<PyCollective>(std::move(impl));
      },
      "impl"_a, "A Collective calling back into `impl` (weightlift._distributed.TorchCollective).");

  m.def(
      "nccl_collective",
      [](uintptr_t comm, uintptr_t stream, int device, double timeout_s) -> std::unique_ptr<wl::Collective> {
        if (!(timeout_s > 0)) raise(wl::Status::InvalidArgument("timeout_s must be positive"));
        auto ms = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        nb::gil_scoped_release nogil;
        return unwrap(wl::nccl_collective(reinterpret_cast<void*>(comm), reinterpret_cast<void*>(stream), device, ms));
      },
      "comm"_a, "stream"_a = 0, "device"_a = 0, "timeout_s"_a = 600.0,
      "A Collective over an ncclComm_t the caller made (an integer address), on CUDA device `device`; "
      "ConnectionError when NCCL or the CUDA runtime cannot be loaded.");
}

}  // namespace wlpy
