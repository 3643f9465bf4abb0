// Loading straight into the caller's memory (weightlift._core.load_into):
// the engine's threads read each tensor into the memory of the matching
// destination tensor (a caller destination, gpu::caller_destination_for),
// with no tensor in between. Returns the engine's figures with the plan that
// ran ("plan": plan_dict, its reasons under "log").
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "py_load_options.h"
#include "weightlift/gpu.h"
#include "weightlift/loader.h"

namespace wlpy {

using namespace nb::literals;

namespace {

struct Target {
  std::byte* data;
  uint64_t nbytes;
  wl::DType dtype;
  wl::Shape shape;
};
using Targets = std::unordered_map<std::string, Target>;

// targets: [(name, data_ptr, nbytes, dtype, shape)] of tensors the caller
// keeps alive for the call, all on options.device: host memory ("cpu",
// "pinned"), which the engine's threads read straight into, or one CUDA
// device ("cuda:N": vLLM's parameters), filled through the engine's pinned
// staging ring. Only these names are read.
nb::dict load_into(const std::vector<std::string>& files, const PyLoadOptions& options,
                   const std::vector<std::tuple<std::string, uintptr_t, uint64_t, std::string, wl::Shape>>& targets) {
  const wl::Device device = unwrap(wl::parse_device(options.device));
  auto map = std::make_shared<Targets>();
  for (auto& [name, ptr, nbytes, dtype, shape] : targets) {
    auto dt = wl::dtype_from_name(dtype);
    if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'").with_tensor(name));
    (*map)[name] = Target{reinterpret_cast<std::byte*>(ptr), nbytes, *dt, shape};
  }
  auto region = [map, device](const wl::TensorRequest& r) -> wl::Result<wl::Region> {
    auto it = map->find(r.name);
    if (it == map->end()) return wl::Status::Internal("no destination for the tensor").with_tensor(r.name);
    const Target& t = it->second;
    if (t.dtype != r.dtype || t.shape != r.shape)
      return wl::Status::InvalidArgument(fmt::format("the checkpoint holds {} {}, the destination is {} {}",
                                                     wl::dtype_name(r.dtype), wl::shape_to_string(r.shape),
                                                     wl::dtype_name(t.dtype), wl::shape_to_string(t.shape)))
          .with_tensor(r.name);
    return wl::Region{t.data, t.nbytes, device, nullptr};
  };
  // CUDA targets: the engine's pinned ring, before anything is read.
  std::unique_ptr<wl::Destination> dest = unwrap(wl::gpu::caller_destination_for(region, device));
  PyLoadOptions rest = options;
  rest.device = "cpu";  // the destination is ours (the caller's memory), not a device destination of its own
  wl::LoadOptions o;
  auto keep = rest.resolve(o);
  o.destination = dest.get();
  o.select = [map](std::string_view n) { return map->count(std::string(n)) > 0; };
  std::vector<std::string> lines;
  std::mutex lines_mu;  // the planning thread, then the load's (prefetch progress, fallbacks)
  o.log = [&](const std::string& line) {
    std::lock_guard lk(lines_mu);
    lines.push_back(wl::inert(line));  // lines name files and URLs
  };
  std::optional<nb::dict> plan;
  wl::Result<wl::LoadStats> r = wl::Status::Internal("not run");
  {
    nb::gil_scoped_release nogil;
    r = wl::load_files(
        files, o, [](wl::LoadedTensor&&) { return wl::Status(); },
        [&plan](const wl::LoadPlan& p) {
          nb::gil_scoped_acquire gil;
          plan = plan_dict(p);
        });
  }
  nb::dict d = stats_dict(unwrap(std::move(r)));
  d["log"] = lines;
  if (plan) d["plan"] = *plan;
  return d;
}

}  // namespace

void bind_load_into(nb::module_& m) { m.def("load_into", &load_into, "files"_a, "options"_a, "targets"_a); }

}  // namespace wlpy
