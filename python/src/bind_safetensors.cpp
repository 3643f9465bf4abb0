// The safetensors format seen from Python: the reader behind
// weightlift.safetensors.safe_open (SafetensorsFile: host reads in the
// engine's read vocabulary, and one tensor into a CUDA device through the
// engine's pinned ring), safetensors' writer API (TensorSpec, serialize,
// serialize_file), the in-memory parser behind deserialize / load, and the
// SafetensorError type.
//
// Errors here are the engine's (ValueError, CorruptDataError, OSError, ...
// with the engine's message); weightlift/_st.py turns them into
// SafetensorError subclasses worded as safetensors words them. TypeError for
// arguments of the wrong type is raised here, worded as safetensors' bindings
// word it.
//
// GIL: released while reading files, writing files and copying tensor bytes.

#include <Python.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/dtype.h"
#include "weightlift/gpu.h"
#include "weightlift/io.h"
#include "weightlift/read_path.h"
#include "weightlift/safetensors.h"
#include "weightlift/shard.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlpy {

namespace {

PyObject* g_safetensor_error = nullptr;  // weightlift.safetensors.SafetensorError(Exception)

[[noreturn]] void raise_type(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

std::string py_type_name(nb::handle h) { return nb::cast<std::string>(h.type().attr("__name__")); }

nb::tuple tensor_tuple(const wl::TensorView& v) {
  return nb::make_tuple(std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()), bytes_array(v.bytes(), v.owner()));
}

// ---- tensors as torch tensors / numpy arrays ------------------------------------------------

enum class Framework { kTorch, kNumpy };

// The DLPack dtype a framework takes straight (its tensor then arrives with
// its dtype and shape: no .view() in Python); nullopt for the others, which
// cross as (dtype, shape, bytes) for weightlift/_tensors.py to reinterpret.
std::optional<nb::dlpack::dtype> direct_dtype(wl::DType t, Framework fw) {
  using C = nb::dlpack::dtype_code;
  auto d = [](C code, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case wl::DType::F16: return d(C::Float, 16);
    case wl::DType::F32: return d(C::Float, 32);
    case wl::DType::F64: return d(C::Float, 64);
    case wl::DType::I8: return d(C::Int, 8);
    case wl::DType::I16: return d(C::Int, 16);
    case wl::DType::I32: return d(C::Int, 32);
    case wl::DType::I64: return d(C::Int, 64);
    case wl::DType::U8: return d(C::UInt, 8);
    case wl::DType::C64: return d(C::Complex, 64);
    case wl::DType::BF16:
      if (fw == Framework::kTorch) return d(C::Bfloat, 16);
      return std::nullopt;
    case wl::DType::BOOL:
      if (fw == Framework::kNumpy) return d(C::Bool, 8);
      return std::nullopt;  // torch takes DLPack bool only from 2.x: a uint8 view instead
    case wl::DType::U16:
    case wl::DType::U32:
    case wl::DType::U64:
      if (fw == Framework::kNumpy) return d(C::UInt, wl::dtype_bits(t));
      return std::nullopt;  // torch >= 2.3 only: through _tensors.py, which knows this torch
    default: return std::nullopt;
  }
}

// `owner` keeps the bytes alive (the view's own owner, or one that also holds
// a background page-cache fill).
nb::object export_view(const std::string& name, const wl::TensorView& v, Framework fw,
                       std::shared_ptr<const void> owner_ptr) {
  auto dt = direct_dtype(v.dtype(), fw);
  if (!dt)
    return nb::make_tuple(std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()),
                          bytes_array(v.bytes(), std::move(owner_ptr)));
  static uint8_t empty_byte = 0;
  auto* keep = new std::shared_ptr<const void>(std::move(owner_ptr));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  size_t shape[32];
  const size_t ndim = v.shape().size();
  if (ndim > 32) raise(wl::Status::InvalidArgument("more than 32 dimensions").with_tensor(name));
  for (size_t i = 0; i < ndim; ++i) shape[i] = static_cast<size_t>(v.shape()[i]);
  void* data = v.bytes().empty() ? static_cast<void*>(&empty_byte) : const_cast<std::byte*>(v.bytes().data());
  if (fw == Framework::kTorch) return nb::cast(nb::ndarray<nb::pytorch>(data, ndim, shape, owner, nullptr, *dt));
  return nb::cast(nb::ndarray<nb::numpy>(data, ndim, shape, owner, nullptr, *dt));
}

// ---- the reader ----------------------------------------------------------------

// safetensors 0.9's TensorMeta: a tensor's header entry, as written in the
// file (dtype name, shape, data_offsets within the data section).
struct TensorMeta {
  wl::DType dtype;
  wl::Shape shape;
  std::pair<uint64_t, uint64_t> data_offsets;
};

std::string meta_repr(const TensorMeta& m) {  // Rust's {:?}, as safetensors prints it
  return fmt::format("TensorMeta {{ dtype: \"{}\", shape: [{}], data_offsets: ({}, {}) }}", wl::dtype_name(m.dtype),
                     fmt::join(m.shape, ", "), m.data_offsets.first, m.data_offsets.second);
}

// One file read as asked, in the engine's read vocabulary (read_path.h's
// strategies, LoadOptions::file_views):
//   lazy, file_views   a private copy-on-write mapping: tensors are zero-copy
//                      views (a write copies the page and never reaches the
//                      file), as safetensors' own torch path maps files
//   lazy               nothing mapped: each get() reads the tensor into a
//                      buffer of its own (safetensors' backend="pread")
//   eager              the whole file read into one buffer now
// Other strategies are kInvalidArgument: they are whole loads (Stream).
class PySafetensorsFile {
 public:
  PySafetensorsFile(const std::string& path, const std::string& strategy, bool file_views) {
    const auto s = wl::strategy_from_name(strategy);
    if (!s || (*s != wl::Strategy::kLazy && *s != wl::Strategy::kEager))
      raise(wl::Status::InvalidArgument("a safetensors handle reads 'lazy' or 'eager', not '" + strategy + "'")
                .with_file(path));
    mapped_ = *s == wl::Strategy::kEager || file_views;
    lazy_ = *s == wl::Strategy::kLazy && file_views;
    nb::gil_scoped_release nogil;
    if (*s == wl::Strategy::kEager) {
      file_ = unwrap(wl::SafetensorsFile::open(path, wl::FileMode::kPread));
      return;
    }
    auto raw =
        unwrap(wl::Env::Default()->open(path, {.mode = lazy_ ? wl::FileMode::kMmapPrivate : wl::FileMode::kPread}));
    file_ = unwrap(wl::SafetensorsFile::open(raw, wl::FileMode::kMmap));
    if (lazy_) cached_ = file_->file()->mostly_cached();
  }

  const std::string& path() const { return file_->path(); }
  std::vector<std::string> names() const { return file_->names(); }
  std::vector<std::string> offset_names() const {
    std::vector<std::string> out;
    out.reserve(file_->tensors().size());
    for (auto& t : file_->tensors()) out.push_back(t.name);
    return out;
  }
  std::map<std::string, std::string> metadata() const { return file_->metadata(); }
  uint64_t file_size() const { return file_->file_size(); }
  uint64_t data_start() const { return file_->header().data_start; }
  size_t size() const { return file_->tensors().size(); }

  // [(name, dtype, shape, offset, nbytes)] in file (offset) order.
  std::vector<std::tuple<std::string, std::string, wl::Shape, uint64_t, uint64_t>> tensors() const {
    std::vector<std::tuple<std::string, std::string, wl::Shape, uint64_t, uint64_t>> out;
    out.reserve(file_->tensors().size());
    for (auto& t : file_->tensors())
      out.emplace_back(t.name, std::string(wl::dtype_name(t.dtype)), t.shape, t.offset, t.nbytes);
    return out;
  }

  std::optional<std::tuple<std::string, wl::Shape>> info(const std::string& name) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) return std::nullopt;
    return std::make_tuple(std::string(wl::dtype_name(t->dtype)), t->shape);
  }

  // (dtype, shape, bytes): zero-copy for lazy and eager, a fresh buffer for pread.
  nb::tuple get(const std::string& name) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) raise(wl::Status::NotFound("no tensor named '" + name + "'").with_file(path()));
    return tensor_tuple(view_of(*t));
  }

  // Like get(), or None when the file holds no such tensor.
  nb::object find(const std::string& name) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) return nb::none();
    return tensor_tuple(view_of(*t));
  }

  // The tensor as a torch tensor (framework "pt") or numpy array ("np") of
  // its dtype and shape, or (dtype, shape, bytes) for a dtype that needs
  // _tensors.py; None when the file holds no such tensor.
  //
  // Cold files (lazy), with `hint`: the tensor's bytes are asked of the
  // kernel in large reads right away (one fault at a time is slow), and when
  // tensors are asked in file order, the next ones too, so the disk works
  // while the caller uses this one. (Not for slices: they may read a part.)
  nb::object typed(const std::string& name, const std::string& framework, bool hint) {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) return nb::none();
    if (hint && lazy_ && !cached_) read_ahead(*t);
    wl::TensorView v = view_of(*t);
    return export_view(name, v, framework_of(framework), v.owner());
  }

  // [(name, typed(name))] for every tensor, in offset order. On a cold lazy
  // file the kernel is asked for the whole data area first (it reads while
  // the caller starts on the first tensors).
  nb::list typed_all(const std::string& framework) {
    const Framework fw = framework_of(framework);
    hint_all();
    nb::list out;
    for (auto& t : file_->tensors()) {
      wl::TensorView v = view_of(t);
      out.append(nb::make_tuple(t.name, export_view(t.name, v, fw, v.owner())));
    }
    return out;
  }

  bool contains(const std::string& name) const { return file_->find(name) != nullptr; }

  // The header entry of `name` (no data read), or None. The name is
  // borrowed from the Python string (no copy): this is called per tensor.
  std::optional<TensorMeta> meta(std::string_view name) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) return std::nullopt;
    const uint64_t base = file_->header().data_start;
    return TensorMeta{t->dtype, t->shape, {t->offset - base, t->offset + t->nbytes - base}};
  }

  // (begin, end, dtype, shape) of a tensor's bytes in the file, or None;
  // `hint`: the kernel is asked for them now, as typed() does.
  nb::object locate(const std::string& name, bool hint) {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) return nb::none();
    if (hint && lazy_ && !cached_) read_ahead(*t);
    return nb::make_tuple(t->offset, t->offset + t->nbytes, std::string(wl::dtype_name(t->dtype)), nb::cast(t->shape));
  }
  // [(name, begin, end, dtype, shape)] of every tensor, in offset order
  // (`hint`: the whole data area asked for, as typed_all() does).
  nb::list locate_all(bool hint) {
    if (hint) hint_all();
    nb::list out;
    for (auto& t : file_->tensors())
      out.append(nb::make_tuple(t.name, t.offset, t.offset + t.nbytes, std::string(wl::dtype_name(t.dtype)),
                                nb::cast(t.shape)));
    return out;
  }
  // The whole file as one writable 1-D uint8 numpy array (the private
  // mapping, or the eager buffer): numpy arrays are slices of it. None for pread.
  nb::object mapping() const {
    if (!mapped_) return nb::none();
    // Any non-empty tensor's view, moved back by its offset, is the start of the file.
    const wl::TensorInfo* some = nullptr;
    for (auto& t : file_->tensors())
      if (t.nbytes) {
        some = &t;
        break;
      }
    if (!some) return nb::none();
    auto a = unwrap(file_->get(some->name));
    auto span = std::span<const std::byte>(a.bytes().data() - some->offset, file_->file_size());
    size_t shape[1] = {span.size()};
    auto* keep = new std::shared_ptr<const void>(a.owner());
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
    return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(const_cast<std::byte*>(span.data()), 1, shape, owner));
  }

  // [(name, dtype, shape, bytes)] for every tensor, in offset order.
  nb::list get_all() const {
    nb::list out;
    for (auto& t : file_->tensors()) {
      wl::TensorView v = view_of(t);
      out.append(nb::make_tuple(t.name, std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()),
                                bytes_array(v.bytes(), v.owner())));
    }
    return out;
  }

  // `name` (rows [begin, end) of its first dimension when `rows` is given)
  // read into `device` ("cuda:N") through the engine's pinned staging ring,
  // from this handle's open file (its header is not read again): (dtype,
  // shape, bytes of device memory that own it). One tensor, one allocation.
  nb::tuple to_device(const std::string& name, std::optional<std::pair<int64_t, int64_t>> rows,
                      const std::string& device) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) raise(wl::Status::NotFound("no tensor named '" + name + "'").with_file(path()));
    const wl::Device d = unwrap(wl::parse_device(device));
    uint64_t offset = t->offset;
    wl::Shape shape = t->shape;
    if (rows) {
      if (shape.empty()) raise(wl::Status::InvalidArgument("rows of a 0-d tensor").with_tensor(name).with_file(path()));
      auto l = wl::slice_layout(t->dtype, t->shape, 0, rows->first, rows->second - rows->first);
      if (!l.ok()) raise(std::move(l).status().with_tensor(name).with_file(path()));
      offset += l->first;
      shape = l->shape;
    }
    wl::TensorView v;
    {
      nb::gil_scoped_release nogil;
      check(wl::gpu::check_device(d));
      auto r = wl::gpu::read_to_device(*file_->file(), offset, t->dtype, std::move(shape), d);
      if (!r.ok()) raise(std::move(r).status().with_tensor(name).with_file(path()));
      v = std::move(*r);
    }
    return nb::make_tuple(std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()),
                          bytes_array(v.bytes(), v.owner(), v.device()));
  }

  // [begin, end) along `dim`, an owned copy reading only those bytes.
  nb::tuple read_slice(const std::string& name, int dim, int64_t begin, int64_t end) const {
    wl::Tensor t;
    {
      nb::gil_scoped_release nogil;
      t = unwrap(file_->read_slice(name, dim, begin, end));
    }
    return tensor_tuple(t.view());
  }

 private:
  wl::TensorView view_of(const wl::TensorInfo& t) const {
    if (mapped_) return unwrap(file_->get(t.name));  // a view: no I/O, nothing to wait for
    nb::gil_scoped_release nogil;
    return unwrap(file_->get(t.name));
  }
  static Framework framework_of(const std::string& f) {
    if (f == "pt") return Framework::kTorch;
    if (f == "np") return Framework::kNumpy;
    raise(wl::Status::InvalidArgument("framework '" + f + "' (expected pt or np)"));
  }
  // Asks the kernel for `t`'s bytes now, and for the next kReadAhead bytes
  // when `t` follows the tensor asked before it.
  void read_ahead(const wl::TensorInfo& t) {
    const auto& f = *file_->file();
    uint64_t end = t.offset + t.nbytes;
    if (t.offset == last_end_ && t.offset) end = std::min<uint64_t>(f.size(), end + kReadAhead);
    last_end_ = t.offset + t.nbytes;
    if (end <= hinted_end_ && t.offset >= hinted_begin_) return;  // asked for already
    // [hinted_begin_, hinted_end_) grows as one range while access runs in order.
    const uint64_t begin = t.offset >= hinted_begin_ && t.offset <= hinted_end_ ? hinted_end_ : t.offset;
    if (t.offset >= hinted_begin_ && t.offset <= hinted_end_) {
      hinted_end_ = end;
    } else {
      hinted_begin_ = t.offset;
      hinted_end_ = end;
    }
    // State updated under the GIL before it is released: threads sharing the handle only ever skip a hint.
    nb::gil_scoped_release nogil;
    will_need(begin, end);
  }

  // A cold lazy file: the whole data area asked for now. A cached one is left
  // to fault in as the caller touches it (as safetensors does: a load_file of
  // tensors the caller never uses costs neither time nor memory).
  void hint_all() {
    if (!lazy_ || cached_ || file_->tensors().empty()) return;
    const uint64_t begin = file_->tensors().front().offset, end = file_->file_size();
    if (hinted_begin_ <= begin && hinted_end_ >= end) return;
    hinted_begin_ = begin;
    hinted_end_ = end;
    nb::gil_scoped_release nogil;
    will_need(begin, end);
  }

  // Asks the kernel to read [begin, end) now. One request is capped at a
  // readahead window (force_page_cache_ra), so a large range goes in chunks;
  // the reads complete in the background.
  void will_need(uint64_t begin, uint64_t end) const {
    const auto& f = *file_->file();
    for (uint64_t at = begin; at < end; at += kHintChunk)
      f.advise(at, std::min(kHintChunk, end - at), wl::Advice::kWillNeed);
  }

  static constexpr uint64_t kReadAhead = uint64_t{64} << 20;  // ahead of tensors asked in file order
  static constexpr uint64_t kHintChunk = uint64_t{2} << 20;   // per readahead request
  bool mapped_ = false;  // file views or eager: get() returns views of memory already there
  bool lazy_ = false;    // file views: views of a mapping, read as they are touched
  bool cached_ = false;  // lazy: the file was mostly in the page cache at open (no hints then)
  uint64_t last_end_ = 0, hinted_begin_ = UINT64_MAX, hinted_end_ = 0;  // read_ahead's state
  std::shared_ptr<wl::SafetensorsFile> file_;
};

// ---- the in-memory parser (deserialize, load) ---------------------------------------

// (metadata, [(name, dtype, shape, begin, end)]) of a whole file held in
// `data`, validated as the file reader validates; begin/end are offsets in data.
nb::tuple parse_safetensors_bytes(nb::handle data) {
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    raise_type(PyExc_TypeError, "argument 'bytes': '" + py_type_name(data) + "' object is not a bytes-like object");
  }
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
  const auto* p = static_cast<const unsigned char*>(view.buf);
  const size_t size = static_cast<size_t>(view.len);
  wl::SafetensorsHeader h;
  {
    nb::gil_scoped_release nogil;
    if (size < 8) raise(wl::Status::Corrupt("header too small (" + std::to_string(size) + " bytes)"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
    if (n > wl::kSafetensorsMaxHeader)
      raise(wl::Status::Corrupt("header length " + std::to_string(n) + " exceeds the 100000000 byte limit"));
    if (n > size - 8)
      raise(wl::Status::Corrupt("header length " + std::to_string(n) + " is past the end of the data (" +
                                std::to_string(size) + " bytes)"));
    h = unwrap(wl::parse_safetensors_header(std::string_view(reinterpret_cast<const char*>(p) + 8, n), size));
  }
  nb::list tensors;
  for (auto& t : h.tensors)
    tensors.append(
        nb::make_tuple(t.name, std::string(wl::dtype_name(t.dtype)), nb::cast(t.shape), t.offset, t.offset + t.nbytes));
  return nb::make_tuple(nb::cast(h.metadata), tensors);
}

// ---- the writer (TensorSpec, serialize, serialize_file) ---------------------------------

// safetensors' TensorSpec: dtype by its Python-side name ("float32",
// "bfloat16", ...), the header's (logical) shape, and a raw pointer and
// length the caller keeps alive while it is serialized.
struct TensorSpec {
  wl::DType dtype = wl::DType::U8;
  std::vector<uint64_t> shape;
  uint64_t data_ptr = 0;
  uint64_t data_len = 0;
};

std::optional<wl::DType> spec_dtype(std::string_view name) {
  static const std::pair<std::string_view, wl::DType> kNames[] = {
      {"bool", wl::DType::BOOL},
      {"int8", wl::DType::I8},
      {"uint8", wl::DType::U8},
      {"int16", wl::DType::I16},
      {"uint16", wl::DType::U16},
      {"int32", wl::DType::I32},
      {"uint32", wl::DType::U32},
      {"int64", wl::DType::I64},
      {"uint64", wl::DType::U64},
      {"float16", wl::DType::F16},
      {"float32", wl::DType::F32},
      {"float64", wl::DType::F64},
      {"bfloat16", wl::DType::BF16},
      {"float8_e4m3fn", wl::DType::F8_E4M3},
      {"float8_e4m3fnuz", wl::DType::F8_E4M3FNUZ},
      {"float8_e5m2", wl::DType::F8_E5M2},
      {"float8_e5m2fnuz", wl::DType::F8_E5M2FNUZ},
      {"float8_e8m0fnu", wl::DType::F8_E8M0},
      {"float4_e2m1fn_x2", wl::DType::F4},
      {"complex64", wl::DType::C64},
  };
  for (auto& [n, d] : kNames)
    if (n == name) return d;
  return std::nullopt;
}

void init_spec(TensorSpec* self, const std::string& dtype, nb::handle shape, nb::handle data_ptr, nb::handle data_len) {
  auto dt = spec_dtype(dtype);
  if (!dt)
    raise_type(g_safetensor_error,
               "Unknown dtype \"" + dtype +
                   "\". Supported dtypes: bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, "
                   "float32, float64, bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, "
                   "float8_e8m0fnu, float4_e2m1fn_x2, complex64");
  auto as_u64 = [](nb::handle v, const char* what) -> uint64_t {
    if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()))
      raise_type(PyExc_TypeError, std::string("argument '") + what + "': '" + py_type_name(v) +
                                      "' object cannot be interpreted as an integer");
    nb::object i = nb::steal(PyNumber_Index(v.ptr()));
    if (!i.is_valid()) throw nb::python_error();
    if (PyObject_RichCompareBool(i.ptr(), nb::int_(0).ptr(), Py_LT) == 1)
      raise_type(PyExc_OverflowError, std::string("argument '") + what + "': can't convert negative int to unsigned");
    unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) throw nb::python_error();
    return x;
  };
  std::vector<uint64_t> dims;
  if (PyUnicode_Check(shape.ptr()) || !PySequence_Check(shape.ptr()))
    raise_type(PyExc_TypeError, "argument 'shape': '" + py_type_name(shape) + "' object is not a sequence of integers");
  for (nb::handle d : nb::iter(shape)) dims.push_back(as_u64(d, "shape"));
  if (*dt == wl::DType::F4 && !dims.empty()) {
    // Two F4 values per byte: frameworks report the storage shape; the header holds the logical one.
    if (dims.back() > UINT64_MAX / 2)
      raise_type(g_safetensor_error,
                 "F4 last-dim " + std::to_string(dims.back()) + " doubled to logical shape overflows usize");
    dims.back() *= 2;
  }
  new (self) TensorSpec{*dt, std::move(dims), as_u64(data_ptr, "data_ptr"), as_u64(data_len, "data_len")};
}

std::string spec_repr(const TensorSpec& s) {
  std::string out = "TensorSpec(dtype='" + std::string(wl::dtype_name(s.dtype)) + "', shape=[";
  for (size_t i = 0; i < s.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(s.shape[i]);
  out += "], data_ptr=" + std::to_string(s.data_ptr) + ", data_len=" + std::to_string(s.data_len) + ")";
  return out;
}

// The tensors of `tensor_dict` ({str: TensorSpec}), checked as safetensors'
// bindings check their arguments (TypeError naming the argument).
std::vector<wl::NamedTensor> spec_tensors(nb::handle tensor_dict) {
  if (!PyDict_Check(tensor_dict.ptr()))
    raise_type(PyExc_TypeError,
               "argument 'tensor_dict': '" + py_type_name(tensor_dict) + "' object is not an instance of 'dict'");
  std::vector<wl::NamedTensor> out;
  out.reserve(PyDict_Size(tensor_dict.ptr()));
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(tensor_dict.ptr(), &pos, &key, &value)) {
    if (!PyUnicode_Check(key))
      raise_type(PyExc_TypeError,
                 "argument 'tensor_dict': '" + py_type_name(key) + "' object is not an instance of 'str'");
    TensorSpec* s = nullptr;
    if (!nb::try_cast<TensorSpec*>(nb::handle(value), s) || s == nullptr)
      raise_type(PyExc_TypeError,
                 "argument 'tensor_dict': '" + py_type_name(value) + "' object is not an instance of 'TensorSpec'");
    Py_ssize_t n = 0;
    const char* k = PyUnicode_AsUTF8AndSize(key, &n);
    if (!k) throw nb::python_error();
    wl::Shape shape;
    shape.reserve(s->shape.size());
    for (uint64_t d : s->shape) {
      if (d > static_cast<uint64_t>(INT64_MAX))
        raise(wl::Status::InvalidArgument("dimension " + std::to_string(d) + " is too large").with_tensor(k));
      shape.push_back(static_cast<int64_t>(d));
    }
    if (s->data_len && !s->data_ptr) raise(wl::Status::InvalidArgument("null data pointer").with_tensor(k));
    auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(s->data_ptr), s->data_len);
    out.push_back({std::string(k, n), wl::TensorView(s->dtype, std::move(shape), bytes, nullptr)});
  }
  return out;
}

std::map<std::string, std::string> metadata_arg(nb::handle metadata) {
  std::map<std::string, std::string> out;
  if (metadata.is_none()) return out;
  if (!PyDict_Check(metadata.ptr()))
    raise_type(PyExc_TypeError,
               "argument 'metadata': '" + py_type_name(metadata) + "' object is not an instance of 'dict'");
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(metadata.ptr(), &pos, &key, &value)) {
    for (PyObject* o : {key, value})
      if (!PyUnicode_Check(o))
        raise_type(PyExc_TypeError,
                   "argument 'metadata': '" + py_type_name(nb::handle(o)) + "' object is not an instance of 'str'");
    out[nb::cast<std::string>(nb::handle(key))] = nb::cast<std::string>(nb::handle(value));
  }
  return out;
}

nb::bytes serialize(nb::handle tensor_dict, nb::handle metadata) {
  auto tensors = spec_tensors(tensor_dict);
  auto meta = metadata_arg(metadata);
  wl::SafetensorsLayout L;
  {
    nb::gil_scoped_release nogil;
    L = unwrap(wl::plan_safetensors(tensors, meta));
  }
  // Filled in place without the GIL: nobody else holds the new object yet.
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(L.total_size));
  if (!out) throw nb::python_error();
  char* dst = PyBytes_AsString(out);  // the function: the abi3 build's limited API has no macro
  if (!dst) {
    Py_DECREF(out);
    throw nb::python_error();
  }
  {
    nb::gil_scoped_release nogil;
    std::memcpy(dst, L.prefix.data(), L.prefix.size());
    size_t at = L.prefix.size();
    for (size_t idx : L.order) {
      auto b = tensors[idx].view.bytes();
      if (!b.empty()) std::memcpy(dst + at, b.data(), b.size());
      at += b.size();
    }
  }
  return nb::steal<nb::bytes>(out);
}

void serialize_file(nb::handle tensor_dict, nb::handle filename, nb::handle metadata) {
  auto tensors = spec_tensors(tensor_dict);
  nb::object fs = nb::steal(PyOS_FSPath(filename.ptr()));
  if (!fs.is_valid()) {
    PyErr_Clear();
    raise_type(PyExc_TypeError, "argument 'filename': '" + py_type_name(filename) + "' object is not a path");
  }
  std::string path =
      PyBytes_Check(fs.ptr()) ? std::string(nb::borrow<nb::bytes>(fs).c_str()) : nb::cast<std::string>(fs);
  auto meta = metadata_arg(metadata);
  nb::gil_scoped_release nogil;
  // Atomic (a temporary renamed into place) but not fsynced: safetensors'
  // own save_file does not sync either.
  check(wl::write_safetensors(path, tensors, meta, wl::Env::Default(), /*sync=*/false));
}

}  // namespace

void bind_safetensors(nb::module_& m) {
  g_safetensor_error =
      PyErr_NewExceptionWithDoc("weightlift.safetensors.SafetensorError",
                                "Custom Python Exception for Safetensor errors.", PyExc_Exception, nullptr);
  m.attr("SafetensorError") = nb::handle(g_safetensor_error);

  nb::class_<PySafetensorsFile>(m, "SafetensorsFile")
      .def(nb::init<const std::string&, const std::string&, bool>(), "path"_a, "strategy"_a = "lazy",
           "file_views"_a = true)
      .def_prop_ro("path", &PySafetensorsFile::path)
      .def_prop_ro("file_size", &PySafetensorsFile::file_size)
      .def_prop_ro("data_start", &PySafetensorsFile::data_start)
      .def("__len__", &PySafetensorsFile::size)
      .def("names", &PySafetensorsFile::names)
      .def("offset_names", &PySafetensorsFile::offset_names)
      .def("metadata", &PySafetensorsFile::metadata)
      .def("tensors", &PySafetensorsFile::tensors)
      .def("info", &PySafetensorsFile::info, "name"_a)
      .def("get", &PySafetensorsFile::get, "name"_a)
      .def("find", &PySafetensorsFile::find, "name"_a)
      .def("get_all", &PySafetensorsFile::get_all)
      .def("typed", &PySafetensorsFile::typed, "name"_a, "framework"_a, "hint"_a = true)
      .def("typed_all", &PySafetensorsFile::typed_all, "framework"_a)
      .def("__contains__", &PySafetensorsFile::contains, "name"_a)
      .def("meta", &PySafetensorsFile::meta, "name"_a)
      .def("locate", &PySafetensorsFile::locate, "name"_a, "hint"_a = false)
      .def("locate_all", &PySafetensorsFile::locate_all, "hint"_a = false)
      .def("mapping", &PySafetensorsFile::mapping)
      .def("read_slice", &PySafetensorsFile::read_slice, "name"_a, "dim"_a, "begin"_a, "end"_a)
      .def("to_device", &PySafetensorsFile::to_device, "name"_a, "rows"_a.none(), "device"_a);

  nb::class_<TensorMeta>(m, "TensorMeta",
                         "A tensor's header entry, as written in the file. No data is read to build it.")
      .def_prop_ro(
          "dtype", [](const TensorMeta& t) { return wl::dtype_name(t.dtype); }, "safetensors dtype name, e.g. \"F32\"")
      .def_prop_ro(
          "shape", [](const TensorMeta& t) { return t.shape; }, "a new list each time")
      .def_ro("data_offsets", &TensorMeta::data_offsets, "(start, end) of the tensor's bytes within the data section")
      .def("__repr__", &meta_repr);

  m.def("parse_safetensors_bytes", &parse_safetensors_bytes, "data"_a);

  nb::class_<TensorSpec>(m, "TensorSpec",
                         "Describes a single tensor passed to serialize / serialize_file: dtype (a framework's "
                         "name: 'float32', 'bfloat16', ...), shape, and a raw pointer and length that the caller "
                         "keeps alive while it is serialized.")
      .def("__init__", &init_spec, nb::kw_only(), "dtype"_a, "shape"_a, "data_ptr"_a, "data_len"_a)
      .def_prop_ro("dtype", [](const TensorSpec& s) { return std::string(wl::dtype_name(s.dtype)); })
      .def_prop_ro("shape", [](const TensorSpec& s) { return s.shape; })
      .def_ro("data_ptr", &TensorSpec::data_ptr)
      .def_ro("data_len", &TensorSpec::data_len)
      .def("__repr__", &spec_repr);

  m.def("serialize", &serialize, "tensor_dict"_a, "metadata"_a = nb::none());
  m.def("serialize_file", &serialize_file, "tensor_dict"_a, "filename"_a, "metadata"_a = nb::none());
}

}  // namespace wlpy
