// The engine's sources seen from Python (io.h's Env: local paths and URLs,
// s3://, gs://, http(s)://): the tensors a file lists, a folder's or
// prefix's entries, a whole small file.
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/checkpoint.h"
#include "weightlift/io.h"

namespace wlpy {

using namespace nb::literals;

namespace {

// [(name, dtype, shape)] of every tensor of the files (headers only), in each file's listing order.
std::vector<std::tuple<std::string, std::string, wl::Shape>> list_tensors(const std::vector<std::string>& files) {
  std::vector<std::tuple<std::string, std::string, wl::Shape>> out;
  nb::gil_scoped_release nogil;
  for (auto& f : files) {
    auto reader = unwrap(wl::open_checkpoint(f));
    for (auto& t : reader->tensors()) out.emplace_back(t.name, std::string(wl::dtype_name(t.dtype)), t.shape);
  }
  return out;
}

// [(name, is_dir, size)] of a folder or an object-store prefix, sorted by name.
std::vector<std::tuple<std::string, bool, uint64_t>> env_list_dir(const std::string& path) {
  std::vector<std::tuple<std::string, bool, uint64_t>> out;
  nb::gil_scoped_release nogil;
  for (auto& e : unwrap(wl::Env::Default()->list_dir(path))) out.emplace_back(e.name, e.is_dir, e.size);
  return out;
}

// A whole small file (configs, tokenizers); larger than max_bytes is
// kInvalidArgument (ValueError) before anything is read or allocated.
nb::bytes env_read_file(const std::string& path, uint64_t max_bytes) {
  std::string data;
  {
    nb::gil_scoped_release nogil;
    auto f = unwrap(wl::Env::Default()->open(path, {.mode = wl::FileMode::kPread}));
    if (f->size() > max_bytes)
      raise(wl::Status::InvalidArgument(
                fmt::format("{} bytes, above the {}-byte limit of a read into memory", f->size(), max_bytes))
                .with_file(path));
    data.resize(f->size());
    check(f->read_at(0, std::as_writable_bytes(std::span<char>(data.data(), data.size()))));
  }
  return nb::bytes(data.data(), data.size());
}

}  // namespace

void bind_env(nb::module_& m) {
  m.def("list_tensors", &list_tensors, "files"_a);
  m.def("env_list_dir", &env_list_dir, "path"_a);
  m.def("env_read_file", &env_read_file, "path"_a, "max_bytes"_a);
}

}  // namespace wlpy
