// weightlift._core: the C++ engine seen from Python (nanobind).
//
// Tensors cross as 1-D uint8 DLPack capsules over the tensor's bytes (no
// copy); each owns a shared_ptr to the mapping or buffer behind them. Every
// such memory is writable and private to this process (a copy-on-write
// mapping or a heap buffer), never the engine's read-only mapping, because
// torch has no read-only tensors. The Python layer (weightlift/_tensors.py)
// turns them into torch tensors (.view(dtype).view(shape)) or numpy arrays.
// Errors cross as Python exceptions carrying wl::Status::to_string().
//
// GIL: every call that reads files releases it.

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/checkpoint.h"
#include "weightlift/convert.h"
#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/np_cache.h"
#include "weightlift/npy.h"
#include "weightlift/safetensors.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlpy {

nb::tuple tensor_tuple(const wl::TensorView& v) {
  return nb::make_tuple(std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()), bytes_array(v.bytes(), v.owner()));
}

// ---- any checkpoint (CheckpointReader) ------------------------------------------

class PyCheckpoint {
 public:
  explicit PyCheckpoint(const std::string& path) {
    nb::gil_scoped_release nogil;
    reader_ = unwrap(wl::open_checkpoint(path));
    // Tensors stored contiguously (file_offset known) become zero-copy views
    // of a private copy-on-write mapping; the others are read into copies.
    bool any_offset = false;
    for (auto& t : reader_->tensors()) any_offset |= t.file_offset.has_value();
    if (any_offset) cow_ = unwrap(wl::Env::Default()->open(path, {.mode = wl::FileMode::kMmapPrivate}));
  }
  const std::string& path() const { return reader_->path(); }
  std::string format() const { return std::string(reader_->format_name()); }
  std::vector<std::tuple<std::string, std::string, wl::Shape, uint64_t>> tensors() const {
    std::vector<std::tuple<std::string, std::string, wl::Shape, uint64_t>> out;
    for (auto& t : reader_->tensors())
      out.emplace_back(t.name, std::string(wl::dtype_name(t.dtype)), t.shape, t.nbytes);
    return out;
  }
  // (dtype, shape, bytes): zero-copy where the bytes lie contiguously in the
  // file, else an owned copy (never the reader's read-only mapping).
  nb::tuple get(size_t index) const {
    if (index >= reader_->tensors().size())
      raise(wl::Status::OutOfRange("tensor index out of range").with_file(path()));
    const wl::CheckpointTensor& t = reader_->tensors()[index];
    if (cow_ && t.file_offset) {
      auto span = cow_->view(*t.file_offset, t.nbytes);
      if (span.ok())
        return nb::make_tuple(std::string(wl::dtype_name(t.dtype)), nb::cast(t.shape), bytes_array(*span, cow_));
    }
    wl::Tensor copy;
    {
      nb::gil_scoped_release nogil;
      copy = unwrap(reader_->read(index));
    }
    return tensor_tuple(copy.view());
  }

 private:
  std::unique_ptr<wl::CheckpointReader> reader_;
  std::shared_ptr<wl::RandomAccessFile> cow_;  // copy-on-write mapping of the file
};

}  // namespace wlpy

using namespace wlpy;

NB_MODULE(_core, m) {
  m.doc() = "weightlift's C++ engine (use the weightlift package, not this module)";

  g_corrupt_error = PyErr_NewExceptionWithDoc("weightlift.CorruptDataError", "A file's bytes violate its format.",
                                              PyExc_ValueError, nullptr);
  g_cancelled_error =
      PyErr_NewExceptionWithDoc("weightlift.CancelledError", "A load was cancelled.", PyExc_RuntimeError, nullptr);
  m.attr("CorruptDataError") = nb::handle(g_corrupt_error);
  m.attr("CancelledError") = nb::handle(g_cancelled_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(exception_type(e.status.code()), e.what());
    }
  });

  nb::class_<PyCheckpoint>(m, "Checkpoint")
      .def(nb::init<const std::string&>(), "path"_a)
      .def_prop_ro("path", &PyCheckpoint::path)
      .def_prop_ro("format", &PyCheckpoint::format)
      .def("tensors", &PyCheckpoint::tensors)
      .def("get", &PyCheckpoint::get, "index"_a);

  m.def(
      "filter_duplicate_safetensors_files",
      [](const std::vector<std::string>& files, const std::string& folder, const std::string& index_name) {
        nb::gil_scoped_release nogil;
        return unwrap(wl::filter_duplicate_safetensors_files(files, folder, index_name));
      },
      "files"_a, "folder"_a, "index_file"_a);
  m.def("filter_files_not_needed_for_inference", &wl::filter_files_not_needed_for_inference, "files"_a);
  m.def(
      "find_weight_files",
      [](const std::string& path) {
        nb::gil_scoped_release nogil;
        wl::WeightFiles wf = unwrap(wl::find_weight_files(path));
        const char* f = wf.format == wl::WeightFormat::kSafetensors ? "safetensors"
                        : wf.format == wl::WeightFormat::kPytorch   ? "pytorch"
                                                                    : "numpy";
        return std::make_pair(wf.files, std::string(f));
      },
      "path"_a);
  m.def("natural_sort", [](std::vector<std::string> v) {
    wl::natural_sort(v);
    return v;
  });
  m.def("dtype_names", [] {
    std::vector<std::string> out;
    for (int i = 0; i < wl::kDTypeCount; ++i) out.emplace_back(wl::dtype_name(static_cast<wl::DType>(i)));
    return out;
  });
  m.def("peak_rss_bytes", [] { return wl::peak_rss_bytes(); });
  // text.h's inert(): the one rendering of outside text, for messages Python builds itself.
  m.def(
      "inert_text", [](const std::string& s) { return wl::inert(s); }, "text"_a);

  // ---- conversion and the NumPy cache ------------------------------------------------
  m.def(
      "convert_pytorch_to_safetensors",
      [](const std::string& input, const std::string& output) {
        wl::ConvertResult r;
        {
          nb::gil_scoped_release nogil;
          r = unwrap(wl::convert_pytorch_to_safetensors(input, output));
        }
        nb::dict d;
        d["tensors"] = r.tensors;
        d["dropped"] = r.dropped;
        d["input_bytes"] = r.input_bytes;
        d["output_bytes"] = r.output_bytes;
        return d;
      },
      "input"_a, "output"_a);
  m.def(
      "np_cache_prepare",
      [](const std::vector<std::string>& files, const std::string& hf_folder, const std::string& lock_path) {
        nb::gil_scoped_release nogil;
        wl::NpCacheResult r = unwrap(wl::np_cache_prepare(files, hf_folder, lock_path));
        return std::make_tuple(r.np_folder, r.names, r.dumped);
      },
      "files"_a, "hf_folder"_a, "lock_path"_a);

  // write_safetensors(path, [(name, dtype, shape, bytes)], metadata): atomic.
  m.def(
      "write_safetensors",
      [](const std::string& path,
         const std::vector<std::tuple<std::string, std::string, wl::Shape,
                                      nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>>& items,
         const std::map<std::string, std::string>& metadata) {
        std::vector<wl::NamedTensor> tensors;
        tensors.reserve(items.size());
        for (auto& [name, dtype, shape, arr] : items) {
          auto dt = wl::dtype_from_name(dtype);
          if (!dt)
            raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'").with_tensor(name).with_file(path));
          auto span = std::span<const std::byte>(reinterpret_cast<const std::byte*>(arr.data()), arr.size());
          tensors.push_back({name, wl::TensorView(*dt, shape, span, nullptr)});
        }
        nb::gil_scoped_release nogil;
        check(wl::write_safetensors(path, tensors, metadata));
      },
      "path"_a, "tensors"_a, "metadata"_a = std::map<std::string, std::string>{});

  // Each component's bindings (python/src/bind_<component>.cpp), declared in bindings.h.
  bind_safetensors(m);
  bind_hub(m);
  bind_gpu(m);
  bind_dist(m);
  bind_engine(m);
  bind_read_ahead(m);
  bind_stream(m);
  bind_load_into(m);
  bind_env(m);
  bind_policies(m);
}
