// The engine seen from Python, its options and plans: typed load options,
// the vocabularies Python takes from the engine (strategies, object-storage
// schemes), and the dry runs (plan_load(...).describe(): what a load would
// decide, the prefetch rule included). Loads themselves are
// bind_stream.cpp (the background load behind every iterator) and
// bind_load_into.cpp (straight into the caller's tensors). Each rule lives
// in C++; these are thin bindings.
//
// GIL: released around every call that reads files or waits.

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "py_load_options.h"
#include "weightlift/gpu.h"
#include "weightlift/load_plan.h"
#include "weightlift/prefetch.h"
#include "weightlift/s3.h"
#include "weightlift/system.h"

namespace wlpy {

using namespace nb::literals;

// ---- typed load options -----------------------------------------------------------------

std::shared_ptr<void> PyLoadOptions::resolve(wl::LoadOptions& out) const {
  out = o;
  const wl::Device d = unwrap(wl::parse_device(device));
  auto g = wl::toggle_from_name(gds);
  if (!g) raise(wl::Status::InvalidArgument("gds must be auto, on or off, not '" + gds + "'"));
  std::shared_ptr<wl::Destination> dest = unwrap(wl::gpu::destination_for(d, {.gds = *g}));
  out.destination = dest.get();
  out.collective = collective.is_valid() && !collective.is_none() ? collective_from(collective) : nullptr;
  if (read_ahead.is_valid() && !read_ahead.is_none()) out.env = read_ahead_env(read_ahead);
  return dest;
}

std::string PyLoadOptions::strategy() const { return std::string(wl::strategy_name(o.strategy)); }
void PyLoadOptions::set_strategy(const std::string& s) {
  auto v = wl::strategy_from_name(s);
  if (!v) {
    const std::vector<std::string>& all = wl::strategy_names();
    std::string names;
    for (size_t i = 0; i < all.size(); ++i) names += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i];
    raise(wl::Status::InvalidArgument("unknown strategy '" + s + "' (expected " + names + ")"));
  }
  o.strategy = *v;
}
std::string PyLoadOptions::direct() const { return std::string(wl::toggle_name(o.direct)); }
void PyLoadOptions::set_direct(const std::string& d) {
  auto t = wl::toggle_from_name(d);
  if (!t) raise(wl::Status::InvalidArgument("direct must be auto, on or off, not '" + d + "'"));
  o.direct = *t;
}
std::string PyLoadOptions::order() const {
  switch (o.order) {
    case wl::LoadOptions::Order::kName: return "name";
    case wl::LoadOptions::Order::kListed: return "listed";
    case wl::LoadOptions::Order::kOffset: break;
  }
  return "offset";
}
void PyLoadOptions::set_order(const std::string& s) {
  if (s == "offset")
    o.order = wl::LoadOptions::Order::kOffset;
  else if (s == "name")
    o.order = wl::LoadOptions::Order::kName;
  else if (s == "listed")
    o.order = wl::LoadOptions::Order::kListed;
  else
    raise(wl::Status::InvalidArgument("order must be offset, name or listed, not '" + s + "'"));
}
void PyLoadOptions::set_rules(const std::vector<std::string>& r) {
  std::vector<wl::ShardRule> parsed;
  for (auto& t : r) parsed.push_back(unwrap(wl::parse_shard_rule(t)));
  o.shard_rules = std::move(parsed);
  rules = r;
}
void PyLoadOptions::set_experts(std::optional<std::set<int64_t>> ids) {
  experts = ids;
  o.local_experts = std::move(ids);
}
std::map<std::string, std::pair<int64_t, int64_t>> PyLoadOptions::rows() const {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (auto& [name, r] : o.rows) out.emplace(name, std::make_pair(r.begin, r.end));
  return out;
}
void PyLoadOptions::set_rows(const std::map<std::string, std::pair<int64_t, int64_t>>& rows) {
  o.rows.clear();
  for (auto& [name, r] : rows) o.rows.emplace(name, wl::RowRange{r.first, r.second});
}

void set_selection(wl::LoadOptions& o, const std::optional<std::vector<std::string>>& names, bool keep) {
  if (!names) return;
  auto set = std::make_shared<std::unordered_set<std::string>>(names->begin(), names->end());
  o.select = [set, keep](std::string_view n) { return set->count(std::string(n)) == static_cast<size_t>(keep); };
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

nb::dict plan_dict(const wl::LoadPlan& plan) {
  const wl::ReadPath& p = plan.path();
  nb::dict d;
  d["strategy"] = std::string(wl::strategy_name(p.strategy));
  d["direct"] = p.direct;
  d["file_views"] = p.file_views;
  d["populate_views"] = p.populate_views;
  d["gds"] = p.gds;
  d["ordered"] = plan.ordered();
  d["max_memory"] = p.max_memory;
  d["threads"] = p.stream.threads;
  d["read_size"] = p.stream.read_size;
  d["window"] = p.stream.window;
  d["copy_source"] = std::string(wl::copy_source_name(p.stream.copy_source));
  d["workers"] = p.workers;
  d["log"] = inert_lines(plan.log());
  std::vector<std::string> warnings;
  if (p.warn && p.prefetch) warnings.push_back(wl::inert(p.prefetch->reason));
  d["warnings"] = warnings;
  d["text"] = inert_lines(plan.describe());
  return d;
}

namespace {

// Facts a dry run's caller holds (Python's patchable helpers); the others
// are found out as a load would.
struct Known {
  std::optional<std::string> fs_type;
  std::optional<uint64_t> checkpoint_bytes, available_bytes;
  std::optional<double> cached_fraction;
  void into(wl::LoadOptions& o) const {
    o.known.fs_type = fs_type;
    o.known.checkpoint_bytes = checkpoint_bytes;
    o.known.available_bytes = available_bytes;
    if (cached_fraction) o.known.cached_fraction = cached_fraction;
  }
};

// plan_load() without a load: what a load of `files` with `options` would
// decide (a collective's plan needs every rank: refused).
wl::LoadPlan dry_run(const std::vector<std::string>& files, const PyLoadOptions& options, const Known& known) {
  if (options.collective.is_valid() && !options.collective.is_none())
    raise(wl::Status::InvalidArgument("a dry run plans one rank's load: drop the collective"));
  wl::LoadOptions o;
  std::shared_ptr<void> keep = options.resolve(o);
  known.into(o);
  nb::gil_scoped_release nogil;
  return unwrap(wl::plan_load(files, o));
}

// The prefetch rule over the files' facts, as a load of them decides it:
// a dry run (strategy auto, or prefetch when requested) with the facts the
// caller gives; the rule over the same facts where the plan does not
// consult it (no files, URLs, files still arriving).
wl::AutoDecision prefetch_verdict(const std::vector<std::string>& files, bool requested, const Known& known) {
  if (!files.empty()) {
    PyLoadOptions options;
    options.o.strategy = requested ? wl::Strategy::kPrefetch : wl::Strategy::kAuto;
    wl::LoadPlan plan = dry_run(files, options, known);
    if (plan.path().prefetch) return *plan.path().prefetch;
  }
  nb::gil_scoped_release nogil;
  std::string fs = known.fs_type ? *known.fs_type : files.empty() ? std::string() : wl::filesystem_type(files[0]);
  uint64_t total = known.checkpoint_bytes ? *known.checkpoint_bytes
                   : files.empty()        ? 0
                                          : unwrap(wl::checkpoint_size_bytes(files));
  uint64_t avail = known.available_bytes ? *known.available_bytes : unwrap(wl::available_ram_bytes());
  return wl::decide_prefetch(std::move(fs), total, avail, requested);
}

void bind_options(nb::module_& m) {
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
      .def_prop_rw(
          "populate_views", [](const PyLoadOptions& p) { return p.o.populate_views; },
          [](PyLoadOptions& p, bool v) { p.o.populate_views = v; })
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
}

}  // namespace

void bind_engine(nb::module_& m) {
  bind_options(m);
  // The one vocabulary of strategies, and the URL schemes of object storage.
  m.def("strategy_names", [] { return wl::strategy_names(); });
  m.def("object_storage_schemes", [] { return wl::object_storage_schemes(); });

  // ---- dry runs: what a load would decide (load_plan.h) ----
  // plan_load(files, options).describe() and the read path as a dict
  // (plan_dict); facts given here win, the others are found out.
  m.def(
      "describe_load",
      [](const std::vector<std::string>& files, const PyLoadOptions& options, std::optional<std::string> fs_type,
         std::optional<uint64_t> checkpoint_bytes, std::optional<uint64_t> available_bytes,
         std::optional<double> cached_fraction) {
        wl::LoadPlan plan = dry_run(files, options, {fs_type, checkpoint_bytes, available_bytes, cached_fraction});
        return plan_dict(plan);
      },
      "files"_a, "options"_a, nb::kw_only(), "fs_type"_a.none() = nb::none(), "checkpoint_bytes"_a.none() = nb::none(),
      "available_bytes"_a.none() = nb::none(), "cached_fraction"_a.none() = nb::none());
  // The prefetch rule (prefetch.h) over facts the caller gives.
  m.def(
      "prefetch_decision",
      [](const std::string& fstype, uint64_t checkpoint_bytes, uint64_t available_bytes, bool requested) {
        wl::AutoDecision d = wl::decide_prefetch(fstype, checkpoint_bytes, available_bytes, requested);
        return nb::make_tuple(d.prefetch, d.warn, d.reason);
      },
      "fstype"_a, "checkpoint_bytes"_a, "available_bytes"_a, "requested"_a);
  // The rule over the files' facts as their load decides it (the iterators'
  // auto prefetch): the filesystem serving files[0], the files' total size
  // and the available RAM, each found out by the dry run unless the caller
  // gives it (vLLM's tests patch the Python helpers that tell them).
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
        return prefetch_verdict(files, requested, {fstype, checkpoint_bytes, available_bytes, std::nullopt});
      },
      "files"_a, "requested"_a = false, nb::kw_only(), "fstype"_a.none() = nb::none(),
      "checkpoint_bytes"_a.none() = nb::none(), "available_bytes"_a.none() = nb::none());
}

}  // namespace wlpy
