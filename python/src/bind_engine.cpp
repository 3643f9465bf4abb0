// The engine seen from Python: typed load options, the background load
// behind every iterator (Stream), loading straight into the caller's tensors
// (load_into), and the policies the iterators ask about (prefetch, system
// facts, natural order, expert filter, dummy values, name remapping, quant
// configs). Each rule lives in C++; these are thin bindings.
//
// GIL: released around every call that reads files or waits.

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/checkpoint.h"
#include "weightlift/destination.h"
#include "weightlift/dummy.h"
#include "weightlift/expert_filter.h"
#include "weightlift/gpu.h"
#include "weightlift/hub.h"
#include "weightlift/loader.h"
#include "weightlift/prefetch.h"
#include "weightlift/quant_config.h"
#include "weightlift/read_path.h"
#include "weightlift/remap.h"
#include "weightlift/shard.h"
#include "weightlift/system.h"
#include "weightlift/weight_files.h"

namespace wlpy {

namespace {

using namespace nb::literals;

// ---- typed load options -----------------------------------------------------------
// wl::LoadOptions with its enums as text; an unknown option is an AttributeError
// (weightlift turns it into a ValueError naming the option).
struct PyLoadOptions {
  wl::LoadOptions o;
  std::vector<std::string> rules;
  std::optional<std::set<int64_t>> experts;
  std::string device = "cpu";  // where tensors land: "cpu", "pinned", "cuda:N" (bind_gpu.cpp)
  std::string gds = "auto";    // GPUDirect Storage for CUDA: "auto", "on", "off"
  nb::object collective;       // a weightlift._core.Collective (bind_dist.cpp), or None
  nb::object read_ahead;  // a weightlift._core.ReadAhead (bind_read_ahead.cpp) whose staging the load reads, or None

  // The load's options with the device destination and the collective in
  // place; the returned owner keeps the destination alive for the load.
  std::shared_ptr<void> resolve(wl::LoadOptions& out) const {
    out = o;
    nb::dict d;
    d["device"] = device;
    d["gds"] = gds;
    std::shared_ptr<void> dest = gpu_destination_option(d, out);
    out.collective = collective.is_valid() && !collective.is_none() ? collective_from(collective) : nullptr;
    if (read_ahead.is_valid() && !read_ahead.is_none()) out.env = read_ahead_env(read_ahead);
    return dest;
  }

  std::string strategy() const { return std::string(wl::strategy_name(o.strategy)); }
  void set_strategy(const std::string& s) {
    auto v = wl::strategy_from_name(s);
    if (!v)
      raise(wl::Status::InvalidArgument("unknown strategy '" + s +
                                        "' (expected lazy, eager, prefetch, auto, threads or stream)"));
    o.strategy = *v;
  }
  std::string direct() const { return std::string(wl::toggle_name(o.direct)); }
  void set_direct(const std::string& d) {
    auto t = wl::toggle_from_name(d);
    if (!t) raise(wl::Status::InvalidArgument("direct must be auto, on or off, not '" + d + "'"));
    o.direct = *t;
  }
  std::string order() const {
    switch (o.order) {
      case wl::LoadOptions::Order::kName: return "name";
      case wl::LoadOptions::Order::kListed: return "listed";
      case wl::LoadOptions::Order::kOffset: break;
    }
    return "offset";
  }
  void set_order(const std::string& s) {
    if (s == "offset")
      o.order = wl::LoadOptions::Order::kOffset;
    else if (s == "name")
      o.order = wl::LoadOptions::Order::kName;
    else if (s == "listed")
      o.order = wl::LoadOptions::Order::kListed;
    else
      raise(wl::Status::InvalidArgument("order must be offset, name or listed, not '" + s + "'"));
  }
  void set_rules(const std::vector<std::string>& r) {
    std::vector<wl::ShardRule> parsed;
    for (auto& t : r) parsed.push_back(unwrap(wl::parse_shard_rule(t)));
    o.shard_rules = std::move(parsed);
    rules = r;
  }
  void set_experts(std::optional<std::set<int64_t>> ids) {
    experts = ids;
    o.local_experts = std::move(ids);
  }
  // {name: (begin, end)}: LoadOptions::rows.
  std::map<std::string, std::pair<int64_t, int64_t>> rows() const {
    std::map<std::string, std::pair<int64_t, int64_t>> out;
    for (auto& [name, r] : o.rows) out.emplace(name, std::make_pair(r.begin, r.end));
    return out;
  }
  void set_rows(const std::map<std::string, std::pair<int64_t, int64_t>>& rows) {
    o.rows.clear();
    for (auto& [name, r] : rows) o.rows.emplace(name, wl::RowRange{r.first, r.second});
  }
};

// Names a load is limited to (`only`) or must leave out (`exclude`).
void set_selection(wl::LoadOptions& o, std::shared_ptr<std::unordered_set<std::string>> names, bool keep) {
  if (!names) return;
  o.select = [names, keep](std::string_view n) { return names->count(std::string(n)) == static_cast<size_t>(keep); };
}

std::shared_ptr<std::unordered_set<std::string>> name_set(const std::optional<std::vector<std::string>>& v) {
  if (!v) return nullptr;
  return std::make_shared<std::unordered_set<std::string>>(v->begin(), v->end());
}

nb::dict stats_dict(const wl::LoadStats& s) {
  nb::dict d;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["skipped_tensors"] = s.skipped_tensors;
  d["bytes_read"] = s.bytes_read;
  d["seconds"] = s.seconds;
  d["strategy"] = std::string(wl::strategy_name(s.strategy));
  d["direct_io"] = s.direct_io;
  d["bytes_exchanged"] = s.bytes_exchanged;
  d["gds"] = s.gds;
  return d;
}

// ---- the background load ------------------------------------------------------------
//
// wl::load_files() runs on a background thread and hands each finished tensor
// to a bounded queue; __next__ pops it (GIL released while waiting). Closing
// or dropping the stream cancels the load and joins the thread. Every
// iterator of weightlift.weight_utils consumes one of these.
class Stream {
 public:
  // ordered: hand tensors over in checkpoint order (LoadOptions::ordered)
  // even when the engine finishes them out of order (stream, threads).
  Stream(std::vector<std::string> files, const PyLoadOptions& options, uint64_t max_queued_bytes,
         std::optional<std::vector<std::string>> only, std::optional<std::vector<std::string>> exclude, bool ordered)
      : max_bytes_(std::max<uint64_t>(max_queued_bytes, 1)), collective_(options.collective),
        read_ahead_(options.read_ahead) {
    dest_ = options.resolve(opts_);
    opts_.ordered = ordered;
    set_selection(opts_, name_set(only), true);
    set_selection(opts_, name_set(exclude), false);
    opts_.progress = [this](const wl::LoadProgress& p) {
      std::lock_guard lk(mu_);
      progress_ = p;
      return !stop_;
    };
    worker_ = std::thread([this, files = std::move(files)] {
      auto r = wl::load_files(files, opts_, [this](wl::LoadedTensor&& t) { return push(std::move(t)); });
      std::lock_guard lk(mu_);
      if (!r.ok())
        status_ = std::move(r).status();
      else
        stats_ = *r;
      done_ = true;
      can_pop_.notify_all();
    });
  }
  ~Stream() { close(); }

  wl::Status push(wl::LoadedTensor&& t) {
    std::unique_lock lk(mu_);
    // Always admit one tensor, however large, so the queue cannot deadlock.
    can_push_.wait(lk, [&] { return stop_ || queue_.empty() || queued_ + t.view.nbytes() <= max_bytes_; });
    if (stop_) return wl::Status::Cancelled("stream closed");
    queued_ += t.view.nbytes();
    queue_.push_back(std::move(t));
    can_pop_.notify_one();
    return wl::Status();
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
                          bytes_array(t->view.bytes(), t->view.owner(), t->view.device()));
  }

  nb::dict progress() {
    std::lock_guard lk(mu_);
    nb::dict d = stats_dict(stats_);
    d["bytes_done"] = progress_.bytes_done;
    d["bytes_total"] = progress_.bytes_total;
    d["tensors_done"] = progress_.tensors_done;
    d["tensors_total"] = progress_.tensors_total;
    d["files_done"] = progress_.files_done;
    d["files_total"] = progress_.files_total;
    return d;
  }

 private:
  wl::LoadOptions opts_;
  uint64_t max_bytes_;
  std::shared_ptr<void> dest_;  // opts_.destination's owner (device loads)
  nb::object collective_;       // keeps opts_.collective alive
  nb::object read_ahead_;       // keeps opts_.env alive when it is a read-ahead's
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

// ---- loading into the caller's memory ------------------------------------------------
//
// targets: [(name, data_ptr, nbytes, dtype, shape)] of tensors the caller
// keeps alive for the call, all on options.device: host memory ("cpu",
// "pinned"), which the engine's threads read straight into, or one CUDA
// device ("cuda:N": vLLM's parameters), filled through the engine's pinned
// staging ring (gpu::make_uploader). Only these names are read.
nb::dict load_into(const std::vector<std::string>& files, const PyLoadOptions& options,
                   const std::vector<std::tuple<std::string, uintptr_t, uint64_t, std::string, wl::Shape>>& targets) {
  const wl::Device device = unwrap(wl::parse_device(options.device));
  std::unique_ptr<wl::Uploader> uploader;  // CUDA targets: the engine's pinned ring, before anything is read
  if (device.kind == wl::DeviceKind::kCuda) uploader = unwrap(wl::gpu::make_uploader(device));
  struct Target {
    std::byte* data;
    uint64_t nbytes;
    wl::DType dtype;
    wl::Shape shape;
  };
  auto map = std::make_shared<std::unordered_map<std::string, Target>>();
  for (auto& [name, ptr, nbytes, dtype, shape] : targets) {
    auto dt = wl::dtype_from_name(dtype);
    if (!dt) raise(wl::Status::InvalidArgument("unknown dtype '" + dtype + "'").with_tensor(name));
    (*map)[name] = Target{reinterpret_cast<std::byte*>(ptr), nbytes, *dt, shape};
  }
  auto dest = wl::caller_destination(
      [map, device](const wl::TensorRequest& r) -> wl::Result<wl::Region> {
        auto it = map->find(r.name);
        if (it == map->end()) return wl::Status::Internal("no destination for the tensor").with_tensor(r.name);
        const Target& t = it->second;
        if (t.dtype != r.dtype || t.shape != r.shape)
          return wl::Status::InvalidArgument(fmt::format("the checkpoint holds {} {}, the destination is {} {}",
                                                         wl::dtype_name(r.dtype), wl::shape_to_string(r.shape),
                                                         wl::dtype_name(t.dtype), wl::shape_to_string(t.shape)))
              .with_tensor(r.name);
        return wl::Region{t.data, t.nbytes, device, nullptr};
      },
      device, uploader.get());
  PyLoadOptions rest = options;
  rest.device = "cpu";  // the destination is ours (the caller's memory), not a device destination of its own
  wl::LoadOptions o;
  auto keep = rest.resolve(o);
  o.destination = dest.get();
  o.select = [map](std::string_view n) { return map->count(std::string(n)) > 0; };
  wl::Result<wl::LoadStats> r = wl::Status::Internal("not run");
  {
    nb::gil_scoped_release nogil;
    r = wl::load_files(files, o, [](wl::LoadedTensor&&) { return wl::Status(); });
  }
  return stats_dict(unwrap(std::move(r)));
}

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

// ---- files through the Env (local paths and URLs: s3://, gs://, http(s)://) ----------------

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

// The read path of a request described by keywords (choose(), read_path.h).
// Facts given here (Python's patchable filesystem helpers) win; the others
// are found out from the files. Returns {"strategy", "direct", "file_views",
// "gds", "max_memory", "log" (reason lines), "warn"}.
nb::dict choose_read_path(const std::vector<std::string>& files, const std::string& strategy, bool file_views,
                          const std::string& direct, const std::string& device, bool caller_memory,
                          const std::string& gds, bool distributed, bool arriving, uint64_t max_memory,
                          std::optional<std::string> fs_type, std::optional<uint64_t> checkpoint_bytes,
                          std::optional<uint64_t> available_bytes, std::optional<double> cached_fraction) {
  wl::ReadRequest r;
  auto s = wl::strategy_from_name(strategy);
  if (!s) raise(wl::Status::InvalidArgument("unknown strategy '" + strategy + "'"));
  auto d = wl::toggle_from_name(direct), g = wl::toggle_from_name(gds);
  if (!d) raise(wl::Status::InvalidArgument("direct must be auto, on or off, not '" + direct + "'"));
  if (!g) raise(wl::Status::InvalidArgument("gds must be auto, on or off, not '" + gds + "'"));
  r.device = unwrap(wl::parse_device(device));
  r.dest = !r.device.host_accessible()                  ? wl::DestKind::kDevice
           : caller_memory                              ? wl::DestKind::kCaller
           : r.device.kind == wl::DeviceKind::kCudaHost ? wl::DestKind::kPinned
                                                        : wl::DestKind::kHost;
  if (!files.empty()) r.first_file = files[0];
  r.source = arriving                   ? wl::SourceKind::kArriving
             : wl::is_url(r.first_file) ? wl::SourceKind::kRemote
                                        : wl::SourceKind::kLocal;
  r.distributed = distributed;
  r.strategy = *s;
  r.direct = *d;
  r.gds = r.dest == wl::DestKind::kDevice ? *g : wl::Toggle::kOff;
  r.file_views = file_views;
  r.max_memory = max_memory;
  wl::Result<wl::ReadPath> path = wl::Status::Internal("not chosen");
  {
    nb::gil_scoped_release nogil;
    auto rest = wl::file_facts(files);
    wl::GivenFacts facts(rest.get());
    if (fs_type) facts.fstype = *fs_type;
    if (checkpoint_bytes) facts.bytes = *checkpoint_bytes;
    if (available_bytes) facts.available = *available_bytes;
    if (cached_fraction) facts.cached = cached_fraction;
    path = wl::choose(r, facts);
  }
  wl::ReadPath p = unwrap(std::move(path));
  nb::dict out;
  out["strategy"] = std::string(wl::strategy_name(p.strategy));
  out["direct"] = p.direct;
  out["file_views"] = p.file_views;
  out["gds"] = p.gds;
  out["max_memory"] = p.max_memory;
  std::vector<std::string> log;
  for (const auto& line : p.log) log.push_back(wl::inert(line));  // lines name files and URLs
  out["log"] = log;
  out["warn"] = p.warn;
  return out;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<PyLoadOptions>(m, "LoadOptions")
      .def(nb::init<>())
      .def_prop_rw("strategy", &PyLoadOptions::strategy, &PyLoadOptions::set_strategy)
      .def_prop_rw(
          "threads", [](const PyLoadOptions& p) { return p.o.threads; },
          [](PyLoadOptions& p, int v) { p.o.threads = v; })
      .def_prop_rw(
          "block_size", [](const PyLoadOptions& p) { return p.o.block_size; },
          [](PyLoadOptions& p, uint64_t v) { p.o.block_size = v; })
      .def_prop_rw(
          "rank", [](const PyLoadOptions& p) { return p.o.rank; }, [](PyLoadOptions& p, int v) { p.o.rank = v; })
      .def_prop_rw(
          "world_size", [](const PyLoadOptions& p) { return p.o.world_size; },
          [](PyLoadOptions& p, int v) { p.o.world_size = v; })
      .def_prop_rw(
          "tp_rank", [](const PyLoadOptions& p) { return p.o.tp_rank; },
          [](PyLoadOptions& p, int64_t v) { p.o.tp_rank = v; })
      .def_prop_rw(
          "tp_size", [](const PyLoadOptions& p) { return p.o.tp_size; },
          [](PyLoadOptions& p, int64_t v) { p.o.tp_size = v; })
      .def_prop_rw(
          "shard_rules", [](const PyLoadOptions& p) { return p.rules; }, &PyLoadOptions::set_rules)
      .def_prop_rw(
          "local_expert_ids", [](const PyLoadOptions& p) { return p.experts; }, &PyLoadOptions::set_experts,
          nb::for_setter(nb::arg("value").none()))
      .def_prop_rw(
          "max_memory", [](const PyLoadOptions& p) { return p.o.max_memory; },
          [](PyLoadOptions& p, uint64_t v) { p.o.max_memory = v; })
      .def_prop_rw("direct", &PyLoadOptions::direct, &PyLoadOptions::set_direct)
      .def_prop_rw(
          "file_views", [](const PyLoadOptions& p) { return p.o.file_views; },
          [](PyLoadOptions& p, bool v) { p.o.file_views = v; })
      .def_prop_rw("order", &PyLoadOptions::order, &PyLoadOptions::set_order)
      .def_prop_rw("rows", &PyLoadOptions::rows, &PyLoadOptions::set_rows)
      .def_prop_rw(
          "device", [](const PyLoadOptions& p) { return p.device; },
          [](PyLoadOptions& p, const std::string& v) {
            (void)unwrap(wl::parse_device(v));
            p.device = v;
          })
      .def_prop_rw(
          "gds", [](const PyLoadOptions& p) { return p.gds; },
          [](PyLoadOptions& p, const std::string& v) {
            if (!wl::toggle_from_name(v))
              raise(wl::Status::InvalidArgument("gds must be auto, on or off, not '" + v + "'"));
            p.gds = v;
          })
      .def_prop_rw(
          "collective", [](const PyLoadOptions& p) { return p.collective; },
          [](PyLoadOptions& p, nb::object v) {
            if (!v.is_none()) (void)collective_from(v);  // a TypeError now, not at load time
            p.collective = std::move(v);
          },
          nb::arg("value").none())
      .def_prop_rw(
          "read_ahead", [](const PyLoadOptions& p) { return p.read_ahead; },
          [](PyLoadOptions& p, nb::object v) {
            if (!v.is_none()) (void)read_ahead_env(v);  // a TypeError now, not at load time
            p.read_ahead = std::move(v);
          },
          nb::arg("value").none());

  nb::class_<Stream>(m, "Stream")
      .def(nb::init<std::vector<std::string>, const PyLoadOptions&, uint64_t, std::optional<std::vector<std::string>>,
                    std::optional<std::vector<std::string>>, bool>(),
           "files"_a, "options"_a, "max_queued_bytes"_a = uint64_t{1} << 30, "only"_a.none() = nb::none(),
           "exclude"_a.none() = nb::none(), "ordered"_a = false)
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &Stream::next)
      .def("close", &Stream::close)
      .def("progress", &Stream::progress);

  m.def("load_into", &load_into, "files"_a, "options"_a, "targets"_a);
  m.def("list_tensors", &list_tensors, "files"_a);
  m.def("env_list_dir", &env_list_dir, "path"_a);
  m.def("env_read_file", &env_read_file, "path"_a, "max_bytes"_a);

  // ---- the read path (read_path.h): one engine call, the same rules as a load ----
  m.def("choose_read_path", &choose_read_path, "files"_a, "strategy"_a = "auto", "file_views"_a = false,
        "direct"_a = "auto", "device"_a = "cpu", "caller_memory"_a = false, "gds"_a = "auto", "distributed"_a = false,
        "arriving"_a = false, "max_memory"_a = 0, "fs_type"_a.none() = nb::none(),
        "checkpoint_bytes"_a.none() = nb::none(), "available_bytes"_a.none() = nb::none(),
        "cached_fraction"_a.none() = nb::none());

  // ---- prefetch and the system facts it is decided on ----
  m.def(
      "prefetch_decision",
      [](const std::string& fstype, uint64_t checkpoint_bytes, uint64_t available_bytes, bool requested) {
        wl::AutoDecision d = wl::decide_prefetch(fstype, checkpoint_bytes, available_bytes, requested);
        return nb::make_tuple(d.prefetch, d.warn, d.reason);
      },
      "fstype"_a, "checkpoint_bytes"_a, "available_bytes"_a, "requested"_a);
  // The rule over the files' facts in one call (the iterators' auto prefetch):
  // the filesystem serving files[0] ("" for none), the files' total size and
  // the available RAM, each measured here unless the caller gives it (vLLM's
  // tests patch the Python helpers that tell them), then choose()'s prefetch
  // rule (the one every load takes; decide_prefetch itself for no files).
  nb::class_<wl::AutoDecision>(m, "PrefetchDecision")
      .def_ro("prefetch", &wl::AutoDecision::prefetch)
      .def_ro("warn", &wl::AutoDecision::warn)
      .def_ro("reason", &wl::AutoDecision::reason)
      .def_ro("fstype", &wl::AutoDecision::fstype)
      .def_ro("checkpoint_bytes", &wl::AutoDecision::checkpoint_bytes)
      .def_ro("available_bytes", &wl::AutoDecision::available_bytes)
      .def("__repr__", [](const wl::AutoDecision& d) {
        return fmt::format("PrefetchDecision(prefetch={}, warn={}, reason='{}')", d.prefetch ? "True" : "False",
                           d.warn ? "True" : "False", d.reason);
      });
  m.def(
      "decide_prefetch",
      [](const std::vector<std::string>& files, bool requested, std::optional<std::string> fstype,
         std::optional<uint64_t> checkpoint_bytes, std::optional<uint64_t> available_bytes) {
        nb::gil_scoped_release nogil;
        std::string fs = fstype ? *fstype : files.empty() ? std::string() : wl::filesystem_type(files[0]);
        uint64_t total = checkpoint_bytes ? *checkpoint_bytes
                         : files.empty()  ? 0
                                          : unwrap(wl::checkpoint_size_bytes(files));
        uint64_t avail = available_bytes ? *available_bytes : unwrap(wl::available_ram_bytes());
        if (files.empty()) return wl::decide_prefetch(std::move(fs), total, avail, requested);
        // The read path's prefetch rule (choose(), read_path.h) over these facts.
        wl::GivenFacts facts;
        facts.fstype = std::move(fs);
        facts.bytes = total;
        facts.available = avail;
        wl::ReadRequest r;
        r.first_file = files[0];
        r.strategy = requested ? wl::Strategy::kPrefetch : wl::Strategy::kAuto;
        wl::ReadPath path = unwrap(wl::choose(r, facts));
        if (!path.prefetch) raise(wl::Status::Internal("choose() did not consult the prefetch rule"));
        return *path.prefetch;
      },
      "files"_a, "requested"_a = false, nb::kw_only(), "fstype"_a.none() = nb::none(),
      "checkpoint_bytes"_a.none() = nb::none(), "available_bytes"_a.none() = nb::none());
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

  // ---- quantization and sparse-attention configs (JSON as text both ways) ----
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

}  // namespace wlpy
