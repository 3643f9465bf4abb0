// The engine's policies seen from Python, each a rule that lives in C++: the
// page-cache prefetcher and the system facts it is decided on, the natural
// order of names, the expert filter, dummy values, checkpoint-name
// remapping, quantization and sparse-attention configs.
//
// GIL: released around every call that reads files or waits.
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/dummy.h"
#include "weightlift/expert_filter.h"
#include "weightlift/hub.h"
#include "weightlift/prefetch.h"
#include "weightlift/quant_config.h"
#include "weightlift/remap.h"
#include "weightlift/system.h"
#include "weightlift/weight_files.h"

namespace wlpy {

using namespace nb::literals;

namespace {

// ---- prefetch ----------------------------------------------------------------------------
class PyPrefetcher {
 public:
  PyPrefetcher(std::vector<std::string> files, int threads, uint64_t block_size, int rank, int world_size) {
    wl::PrefetchOptions po;
    po.threads = threads;
    po.block_size = block_size;
    po.rank = rank;
    po.world_size = world_size;
    po.log = [this](const std::string& line) {
      std::lock_guard lk(mu_);
      lines_.push_back(wl::inert(line));  // lines name files and URLs
    };
    p_ = unwrap(wl::Prefetcher::start(std::move(files), std::move(po)));
  }
  ~PyPrefetcher() {
    nb::gil_scoped_release nogil;
    p_.reset();
  }
  void wait() {
    nb::gil_scoped_release nogil;
    p_->wait();
  }
  // Log lines so far (taken).
  std::vector<std::string> take_log() {
    std::lock_guard lk(mu_);
    return std::exchange(lines_, {});
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
  std::unique_ptr<wl::Prefetcher> p_;
};

// A Python object's `in` and iteration as the remapping's name lookup (GIL held).
wl::ParamLookup lookup_of(nb::handle params) {
  return {[params](const std::string& n) {
            return PySequence_Contains(params.ptr(), nb::str(n.c_str(), n.size()).ptr()) == 1;
          },
          [params](std::string_view text) {
            std::string t(text);
            for (nb::handle k : params)
              if (nb::isinstance<nb::str>(k) && nb::cast<std::string>(k).find(t) != std::string::npos) return true;
            return false;
          }};
}

wl::JsonDownloader hub_downloader(std::optional<bool> offline) {
  return [offline](const std::string& repo, const std::string& revision, const std::string& pattern,
                   const std::string& dir) {
    wl::HubOptions o;
    o.offline = offline;
    return wl::download_config_files(repo, revision, pattern, dir, o);
  };
}

// The prefetcher and the system facts its rule is decided on; the natural order of names.
void bind_prefetch(nb::module_& m) {
  nb::class_<PyPrefetcher>(m, "Prefetcher")
      .def(nb::init<std::vector<std::string>, int, uint64_t, int, int>(), "files"_a, "threads"_a, "block_size"_a,
           "rank"_a = 0, "world_size"_a = 1)
      .def("wait", &PyPrefetcher::wait)
      .def("take_log", &PyPrefetcher::take_log);
  m.def(
      "prefetch_files",
      [](const std::vector<std::string>& files, int threads, uint64_t block_size) {
        wl::PrefetchOptions po;
        po.threads = threads;
        po.block_size = block_size;
        nb::gil_scoped_release nogil;
        check(wl::prefetch_files(files, po));
      },
      "files"_a, "threads"_a, "block_size"_a);
  m.def(
      "filesystem_type", [](const std::string& path) { return wl::filesystem_type(path); }, "path"_a);
  m.def("available_ram_bytes", [] { return unwrap(wl::available_ram_bytes()); });
  m.def(
      "checkpoint_size_bytes",
      [](const std::vector<std::string>& files) {
        nb::gil_scoped_release nogil;
        return unwrap(wl::checkpoint_size_bytes(files));
      },
      "files"_a);
  m.def(
      "natural_key", [](const std::string& name) { return wl::natural_key(name); }, "name"_a);
}

// Rules over names: the expert filter, dummy values, checkpoint-name remapping.
void bind_names(nb::module_& m) {
  // ---- expert parallelism ----
  m.def(
      "parse_expert_id", [](const std::string& name) { return wl::parse_expert_id(name); }, "name"_a);
  m.def(
      "should_skip_weight",
      [](const std::string& name, std::optional<std::set<int64_t>> ids) { return wl::should_skip_weight(name, ids); },
      "name"_a, "local_expert_ids"_a.none());
  m.def(
      "compute_local_expert_ids",
      [](int64_t num_experts, int64_t ep_size, int64_t ep_rank, const std::string& placement) {
        return unwrap(
            wl::compute_local_expert_ids(num_experts, ep_size, ep_rank, unwrap(wl::parse_expert_placement(placement))));
      },
      "num_experts"_a, "ep_size"_a, "ep_rank"_a, "placement"_a);

  // ---- dummy values into host memory the caller owns ----
  m.def("dummy_fills", [](const std::string& dtype) {
    auto dt = wl::dtype_from_name(dtype);
    return dt && wl::dummy_fills(*dt);
  });
  m.def(
      "fill_dummy",
      [](const std::string& dtype, uintptr_t ptr, uint64_t nbytes, uint64_t numel, double low, double high,
         uint64_t seed) {
        auto dt = wl::dtype_from_name(dtype);
        if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'"));
        std::span<std::byte> bytes(reinterpret_cast<std::byte*>(ptr), nbytes);
        nb::gil_scoped_release nogil;
        check(wl::fill_dummy(*dt, bytes, numel, wl::DummyOptions{low, high, seed, 0}));
      },
      "dtype"_a, "ptr"_a, "nbytes"_a, "numel"_a, "low"_a, "high"_a, "seed"_a);

  // ---- checkpoint-name remapping (params: anything with `in` and iteration) ----
  m.def(
      "maybe_remap_kv_scale_name",
      [](const std::string& name, nb::handle params) {
        std::vector<std::string> warnings;
        auto r = wl::maybe_remap_kv_scale_name(name, lookup_of(params),
                                               [&](const std::string& w) { warnings.push_back(w); });
        return std::make_pair(r, warnings);
      },
      "name"_a, "params"_a);
  m.def(
      "maybe_remap_moe_expert_param_name",
      [](const std::string& name, nb::handle params) {
        return wl::maybe_remap_moe_expert_param_name(name, lookup_of(params));
      },
      "name"_a, "params"_a);
}

// Quantization and sparse-attention configs (JSON as text both ways).
void bind_configs(nb::module_& m) {
  m.def(
      "get_quant_config",
      [](const std::string& model, const std::string& quantization, std::optional<std::string> hf_config,
         const std::string& hf_overrides, std::optional<std::string> online, const std::string& revision,
         const std::string& download_dir, std::optional<bool> offline) {
        wl::QuantConfigRequest rq;
        rq.model = model;
        rq.quantization = quantization;
        rq.hf_config = hf_config;  // JSON text; the engine checks it
        rq.hf_overrides = hf_overrides;
        rq.online_quantization = online;
        rq.revision = revision;
        rq.download_dir = download_dir;
        rq.download = hub_downloader(offline);
        wl::Result<wl::QuantConfigResult> r = wl::Status::Internal("not run");
        {
          nb::gil_scoped_release nogil;
          r = wl::get_quant_config(rq);
        }
        wl::QuantConfigResult q = unwrap(std::move(r));
        return nb::make_tuple(q.config, std::string(wl::quant_config_source_name(q.source)), q.file, q.folder);
      },
      "model"_a, "quantization"_a, "hf_config"_a.none(), "hf_overrides"_a, "online"_a.none(), "revision"_a,
      "download_dir"_a, "offline"_a.none());
  m.def(
      "get_sparse_attention_config",
      [](const std::string& model, const std::string& revision, const std::string& download_dir,
         const std::string& file_name, std::optional<bool> offline) {
        wl::Result<std::string> r = wl::Status::Internal("not run");
        {
          nb::gil_scoped_release nogil;
          r = wl::get_sparse_attention_config(model, revision, download_dir, hub_downloader(offline), file_name);
        }
        return unwrap(std::move(r));
      },
      "model"_a, "revision"_a, "download_dir"_a, "file_name"_a, "offline"_a.none());
}

}  // namespace

void bind_policies(nb::module_& m) {
  bind_prefetch(m);
  bind_names(m);
  bind_configs(m);
}

}  // namespace wlpy
