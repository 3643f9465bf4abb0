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

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "weightlift/checkpoint.h"
#include "weightlift/convert.h"
#include "weightlift/npy.h"
#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/safetensors.h"
#if __has_include("weightlift/shard.h")
#include "weightlift/shard.h"
#endif
#if __has_include("weightlift/expert_filter.h")
#include "weightlift/expert_filter.h"
#endif
#include "weightlift/status.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"
#include "bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlpy {

nb::tuple tensor_tuple(const wl::TensorView& v) {
  return nb::make_tuple(std::string(wl::dtype_name(v.dtype())), nb::cast(v.shape()),
                        bytes_array(v.bytes(), v.owner()));
}

// Files are mapped copy-on-write (Env kMmapPrivate), as safetensors' own
// torch path maps them: tensors are zero-copy and writable; a write copies the
// touched page for this process and never reaches the file.

// ---- SafetensorsFile ----------------------------------------------------------

class PySafetensorsFile {
 public:
  PySafetensorsFile(const std::string& path, const std::string& strategy) : strategy_(strategy) {
    nb::gil_scoped_release nogil;
    if (strategy == "eager") {
      file_ = unwrap(wl::SafetensorsFile::open(path, wl::LoadMode::kEager));
      return;
    }
    if (strategy != "lazy")
      raise(wl::Status::InvalidArgument("unknown strategy '" + strategy + "' (expected lazy or eager)").with_file(path));
    auto raw = unwrap(wl::Env::Default()->open(path, {.mode = wl::FileMode::kMmapPrivate}));
    file_ = unwrap(wl::SafetensorsFile::open(raw, wl::LoadMode::kLazy));
  }

  const std::string& path() const { return file_->path(); }
  std::vector<std::string> names() const { return file_->names(); }
  std::map<std::string, std::string> metadata() const { return file_->metadata(); }
  uint64_t file_size() const { return file_->file_size(); }
  uint64_t data_start() const { return file_->header().data_start; }

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

  // (dtype, shape, bytes): zero-copy.
  nb::tuple get(const std::string& name) const {
    const wl::TensorInfo* t = file_->find(name);
    if (!t) raise(wl::Status::NotFound("no tensor named '" + name + "'").with_file(path()));
    wl::TensorView v;
    {
      nb::gil_scoped_release nogil;
      v = unwrap(file_->get(name));
    }
    return tensor_tuple(v);
  }

  // Rows [begin, end) along dim 0, an owned copy reading only those bytes.
  nb::tuple read_rows(const std::string& name, int64_t begin, int64_t end) const {
    wl::Tensor t;
    {
      nb::gil_scoped_release nogil;
      t = unwrap(file_->read_rows(name, begin, end));
    }
    return tensor_tuple(t.view());
  }

 private:
  std::string strategy_;
  std::shared_ptr<wl::SafetensorsFile> file_;
};

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
    for (auto& t : reader_->tensors()) out.emplace_back(t.name, std::string(wl::dtype_name(t.dtype)), t.shape, t.nbytes);
    return out;
  }
  // (dtype, shape, bytes): zero-copy where the bytes lie contiguously in the
  // file, else an owned copy (never the reader's read-only mapping).
  nb::tuple get(size_t index) const {
    if (index >= reader_->tensors().size()) raise(wl::Status::OutOfRange("tensor index out of range").with_file(path()));
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

// ---- the streaming loader ---------------------------------------------------------
//
// wl::load_files() runs on a background thread and hands each finished tensor
// to a bounded queue; __next__ pops it (GIL released while waiting). Closing
// or dropping the stream cancels the load and joins the thread.

class Stream {
 public:
  Stream(std::vector<std::string> files, const std::string& strategy, uint64_t max_queued_bytes, const nb::dict& engine)
      : max_bytes_(std::max<uint64_t>(max_queued_bytes, 1)) {
    auto s = wl::strategy_from_name(strategy);
    if (!s) raise(wl::Status::InvalidArgument("unknown strategy '" + strategy + "'"));
    opts_.strategy = *s;
    configure(engine);
    opts_.progress = [this](const wl::LoadProgress& p) {
      std::lock_guard lk(mu_);
      progress_ = p;
      return !stop_;
    };
    worker_ = std::thread([this, files = std::move(files)] {
      auto push = [this](wl::LoadedTensor&& t) -> wl::Status {
        std::unique_lock lk(mu_);
        // Always admit one tensor, however large, so the queue cannot deadlock.
        can_push_.wait(lk, [&] { return stop_ || queue_.empty() || queued_ + t.view.nbytes() <= max_bytes_; });
        if (stop_) return wl::Status::Cancelled("stream closed");
        queued_ += t.view.nbytes();
        queue_.push_back(std::move(t));
        can_pop_.notify_one();
        return wl::Status::Ok();
      };
      // ordered: tensors leave in checkpoint order (file, then offset); one
      // that finishes early waits here (within the engine's memory window).
      std::map<uint64_t, wl::LoadedTensor> held;
      uint64_t next_ordinal = 0;
      auto r = wl::load_files(files, opts_, [&](wl::LoadedTensor&& t) -> wl::Status {
        if (!ordered_) return push(std::move(t));
        held.emplace(t.ordinal, std::move(t));
        while (!held.empty() && held.begin()->first == next_ordinal) {
          auto node = held.extract(held.begin());
          ++next_ordinal;
          WL_RETURN_IF_ERROR(push(std::move(node.mapped())));
        }
        return wl::Status::Ok();
      });
      for (auto& [_, t] : held)
        if (r.ok() && !push(std::move(t)).ok()) break;
      std::lock_guard lk(mu_);
      if (!r.ok()) status_ = std::move(r).status();
      else stats_ = *r;
      done_ = true;
      can_pop_.notify_all();
    });
  }
  ~Stream() { close(); }

  // The engine's options, by name (Python's keyword arguments); an option
  // this build's engine does not have is a ValueError naming it.
  void configure(const nb::dict& engine) {
    for (auto [k, v] : engine) {
      std::string key = nb::cast<std::string>(k);
      if (key == "ordered") { ordered_ = nb::cast<bool>(v); continue; }
#if __has_include("weightlift/shard.h")  // the engine with parallel strategies, TP and EP
      if (key == "threads") { opts_.threads = nb::cast<int>(v); continue; }
      if (key == "block_size") { opts_.block_size = nb::cast<uint64_t>(v); continue; }
      if (key == "rank") { opts_.rank = nb::cast<int>(v); continue; }
      if (key == "world_size") { opts_.world_size = nb::cast<int>(v); continue; }
      if (key == "tp_rank") { opts_.tp_rank = nb::cast<int64_t>(v); continue; }
      if (key == "tp_size") { opts_.tp_size = nb::cast<int64_t>(v); continue; }
      if (key == "max_memory") { opts_.max_memory = nb::cast<uint64_t>(v); continue; }
      if (key == "shard_rules") {
        for (auto rule : nb::cast<std::vector<std::string>>(v)) opts_.shard_rules.push_back(unwrap(wl::parse_shard_rule(rule)));
        continue;
      }
      if (key == "local_expert_ids") {
        if (!v.is_none()) {
          std::set<int64_t> ids;
          for (auto id : nb::cast<std::vector<int64_t>>(v)) ids.insert(id);
          opts_.local_experts = std::move(ids);
        }
        continue;
      }
      if (key == "direct") {
        std::string d = nb::cast<std::string>(v);
        if (d == "auto") opts_.direct = wl::DirectIo::kAuto;
        else if (d == "on") opts_.direct = wl::DirectIo::kOn;
        else if (d == "off") opts_.direct = wl::DirectIo::kOff;
        else raise(wl::Status::InvalidArgument("direct must be auto, on or off, not '" + d + "'"));
        continue;
      }
#endif
      if (key == "local_expert_ids" && v.is_none()) continue;
      raise(wl::Status::InvalidArgument("this build's loader has no option '" + key + "'"));
    }
  }

  void close() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      can_push_.notify_all();
    }
    if (worker_.joinable()) {
      nb::gil_scoped_release nogil;
      worker_.join();
    }
  }

  // (name, file, dtype, shape, bytes); raises StopIteration at the end.
  nb::tuple next() {
    std::optional<wl::LoadedTensor> t;
    {
      nb::gil_scoped_release nogil;
      std::unique_lock lk(mu_);
      can_pop_.wait(lk, [&] { return !queue_.empty() || done_; });
      if (!queue_.empty()) {
        t = std::move(queue_.front());
        queue_.pop_front();
        queued_ -= t->view.nbytes();
        can_push_.notify_all();
      }
    }
    if (!t) {
      std::unique_lock lk(mu_);
      if (!status_.ok() && !(stop_ && status_.code() == wl::Code::kCancelled)) {
        wl::Status s = std::move(status_);
        status_ = wl::Status();
        lk.unlock();
        raise(std::move(s));
      }
      throw nb::stop_iteration();
    }
    return nb::make_tuple(t->name, t->file, std::string(wl::dtype_name(t->view.dtype())), nb::cast(t->view.shape()),
                          bytes_array(t->view.bytes(), t->view.owner()));
  }

  nb::dict progress() {
    std::lock_guard lk(mu_);
    nb::dict d;
    d["bytes_done"] = progress_.bytes_done;
    d["bytes_total"] = progress_.bytes_total;
    d["tensors_done"] = progress_.tensors_done;
    d["tensors_total"] = progress_.tensors_total;
    d["files_done"] = progress_.files_done;
    d["files_total"] = progress_.files_total;
    d["seconds"] = stats_.seconds;
    return d;
  }

 private:
  wl::LoadOptions opts_;
  bool ordered_ = false;
  uint64_t max_bytes_;
  std::mutex mu_;
  std::condition_variable can_push_, can_pop_;
  std::deque<wl::LoadedTensor> queue_;
  uint64_t queued_ = 0;
  bool stop_ = false, done_ = false;
  wl::Status status_;
  wl::LoadStats stats_;
  wl::LoadProgress progress_;
  std::thread worker_;
};

}  // namespace wlpy

using namespace wlpy;

NB_MODULE(_core, m) {
  m.doc() = "weightlift's C++ engine (use the weightlift package, not this module)";

  g_corrupt_error = PyErr_NewExceptionWithDoc("weightlift.CorruptDataError",
                                              "A file's bytes violate its format.", PyExc_ValueError, nullptr);
  g_cancelled_error = PyErr_NewExceptionWithDoc("weightlift.CancelledError", "A load was cancelled.",
                                                PyExc_RuntimeError, nullptr);
  m.attr("CorruptDataError") = nb::handle(g_corrupt_error);
  m.attr("CancelledError") = nb::handle(g_cancelled_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(exception_type(e.status.code()), e.what());
    }
  });

  nb::class_<PySafetensorsFile>(m, "SafetensorsFile")
      .def(nb::init<const std::string&, const std::string&>(), "path"_a, "strategy"_a = "lazy")
      .def_prop_ro("path", &PySafetensorsFile::path)
      .def_prop_ro("file_size", &PySafetensorsFile::file_size)
      .def_prop_ro("data_start", &PySafetensorsFile::data_start)
      .def("names", &PySafetensorsFile::names)
      .def("metadata", &PySafetensorsFile::metadata)
      .def("tensors", &PySafetensorsFile::tensors)
      .def("info", &PySafetensorsFile::info, "name"_a)
      .def("get", &PySafetensorsFile::get, "name"_a)
      .def("read_rows", &PySafetensorsFile::read_rows, "name"_a, "begin"_a, "end"_a);

  nb::class_<PyCheckpoint>(m, "Checkpoint")
      .def(nb::init<const std::string&>(), "path"_a)
      .def_prop_ro("path", &PyCheckpoint::path)
      .def_prop_ro("format", &PyCheckpoint::format)
      .def("tensors", &PyCheckpoint::tensors)
      .def("get", &PyCheckpoint::get, "index"_a);

  nb::class_<Stream>(m, "Stream")
      .def(nb::init<std::vector<std::string>, const std::string&, uint64_t, const nb::dict&>(), "files"_a,
           "strategy"_a = "lazy", "max_queued_bytes"_a = uint64_t{1} << 30, "engine"_a = nb::dict())
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &Stream::next)
      .def("close", &Stream::close)
      .def("progress", &Stream::progress);

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

#if __has_include("weightlift/expert_filter.h")
  // The engine's expert filter (the Python one in weightlift.ep_weight_filter
  // must agree with it; tests/python checks both on the same names).
  m.def("parse_expert_id", [](const std::string& name) { return wl::parse_expert_id(name); }, "name"_a);
  m.def(
      "should_skip_weight",
      [](const std::string& name, std::optional<std::vector<int64_t>> ids) {
        std::optional<std::set<int64_t>> local;
        if (ids) local = std::set<int64_t>(ids->begin(), ids->end());
        return wl::should_skip_weight(name, local);
      },
      "name"_a, "local_expert_ids"_a.none());
#endif

  // write_safetensors(path, [(name, dtype, shape, bytes)], metadata): atomic.
  m.def(
      "write_safetensors",
      [](const std::string& path,
         const std::vector<std::tuple<std::string, std::string, wl::Shape, nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>>& items,
         const std::map<std::string, std::string>& metadata) {
        std::vector<wl::NamedTensor> tensors;
        tensors.reserve(items.size());
        for (auto& [name, dtype, shape, arr] : items) {
          auto dt = wl::dtype_from_name(dtype);
          if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'").with_tensor(name).with_file(path));
          auto span = std::span<const std::byte>(reinterpret_cast<const std::byte*>(arr.data()), arr.size());
          tensors.push_back({name, wl::TensorView(*dt, shape, span, nullptr)});
        }
        nb::gil_scoped_release nogil;
        check(wl::write_safetensors(path, tensors, metadata));
      },
      "path"_a, "tensors"_a, "metadata"_a = std::map<std::string, std::string>{});

  // Each component's bindings (python/src/bind_<component>.cpp), declared in bindings.h.
  bind_hub(m);

}
