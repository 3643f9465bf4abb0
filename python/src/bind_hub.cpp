// The Hugging Face Hub from Python: vLLM's download functions, ModelScope,
// and HubSource (a repository's weights served while they download).
//
// Log lines come from download threads; they are collected and returned to
// Python, which logs them (no Python call happens off the GIL).
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/hub.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace wlpy {
namespace {

struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  std::vector<std::string> take() {
    std::lock_guard lk(mu);
    return std::exchange(lines, {});
  }
};

wl::HubOptions hub_options(const std::string& cache_dir, std::optional<bool> offline,
                           const std::shared_ptr<LogSink>& sink) {
  wl::HubOptions o;
  o.cache_dir = cache_dir;
  o.offline = offline;
  o.log = [sink](const std::string& line) {
    std::lock_guard lk(sink->mu);
    sink->lines.push_back(wl::inert(line));  // the Hub's names and messages: inert (text.h)
  };
  return o;
}

// A HubSource with the log lines its threads produce.
class PyHubSource {
 public:
  PyHubSource(const std::string& repo_id, const std::string& revision, const std::string& cache_dir,
              std::optional<bool> offline)
      : sink_(std::make_shared<LogSink>()), options_(hub_options(cache_dir, offline, sink_)) {
    nb::gil_scoped_release nogil;
    source_ = unwrap(wl::HubSource::start(repo_id, revision, options_));
  }
  const std::string& folder() const { return source_->folder(); }
  std::vector<std::string> weight_files() const { return source_->weight_files(); }
  std::vector<std::string> pending() const { return source_->pending(); }
  void finish() {
    wl::Status s;
    {
      nb::gil_scoped_release nogil;
      s = source_->finish();
    }
    check(std::move(s));
  }
  std::vector<std::string> logs() { return sink_->take(); }

 private:
  std::shared_ptr<LogSink> sink_;
  wl::HubOptions options_;  // outlives the source, which keeps a reference to it
  std::unique_ptr<wl::HubSource> source_;
};

}  // namespace

void bind_hub(nb::module_& m) {
  m.def(
      "download_weights_from_hf",
      [](const std::string& model, const std::vector<std::string>& allow, const std::string& revision,
         const std::vector<std::string>& ignore, const std::string& cache_dir, std::optional<bool> offline,
         const std::string& subfolder) {
        auto sink = std::make_shared<LogSink>();
        wl::Result<std::string> r = wl::Status::Internal("not run");
        {
          nb::gil_scoped_release nogil;
          r = wl::download_weights_from_hf(model, allow, revision, ignore, hub_options(cache_dir, offline, sink),
                                           subfolder);
        }
        if (!r.ok()) raise(std::move(r).status());
        return std::make_pair(*r, sink->take());
      },
      "model"_a, "allow_patterns"_a, "revision"_a, "ignore_patterns"_a, "cache_dir"_a, "offline"_a.none(),
      "subfolder"_a);
  m.def(
      "download_safetensors_index_file_from_hf",
      [](const std::string& model, const std::string& index_file, const std::string& revision,
         const std::string& cache_dir, std::optional<bool> offline, const std::string& subfolder) {
        auto sink = std::make_shared<LogSink>();
        wl::Status st;
        {
          nb::gil_scoped_release nogil;
          st = wl::download_safetensors_index_file_from_hf(model, index_file, revision,
                                                           hub_options(cache_dir, offline, sink), subfolder);
        }
        check(std::move(st));
        return sink->take();
      },
      "model"_a, "index_file"_a, "revision"_a, "cache_dir"_a, "offline"_a.none(), "subfolder"_a);
  m.def("model_lock_path", &wl::model_lock_path, "model"_a, "cache_dir"_a);
  m.def(
      "modelscope_snapshot_download",
      [](const std::string& model, const std::string& revision, const std::string& cache_dir,
         const std::vector<std::string>& allow, const std::vector<std::string>& ignore, std::optional<bool> offline) {
        auto sink = std::make_shared<LogSink>();
        wl::SnapshotOptions s;
        s.revision = revision;
        s.allow_patterns = allow;
        s.ignore_patterns = ignore;
        wl::Result<std::string> r = wl::Status::Internal("not run");
        {
          nb::gil_scoped_release nogil;
          r = wl::modelscope_snapshot_download(model, s, hub_options(cache_dir, offline, sink));
        }
        if (!r.ok()) raise(std::move(r).status());
        return std::make_pair(*r, sink->take());
      },
      "model"_a, "revision"_a, "cache_dir"_a, "allow_patterns"_a, "ignore_patterns"_a, "offline"_a.none());

  nb::class_<PyHubSource>(m, "HubSource")
      .def(nb::init<const std::string&, const std::string&, const std::string&, std::optional<bool>>(), "repo_id"_a,
           "revision"_a = "main", "cache_dir"_a = "", "offline"_a.none() = nb::none())
      .def_prop_ro("folder", &PyHubSource::folder)
      .def_prop_ro("weight_files", &PyHubSource::weight_files)
      .def_prop_ro("pending", &PyHubSource::pending)
      .def("finish", &PyHubSource::finish)
      .def("logs", &PyHubSource::logs);
}

}  // namespace wlpy
