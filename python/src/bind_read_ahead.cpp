// A load's work started before the load, while the caller builds the
// memory it will fill (the vLLM plug-in, while vLLM constructs the model):
//   weightlift._core.ReadAhead   its reads (weightlift/read_ahead.h), handed
//                                to the load as the engine option "read_ahead"
//                                (remote sources then read staged bytes)
//   weightlift._core.Prefaulter  the first touch of the caller's memory
//                                (destination.h), fed each parameter as it
//                                is allocated
//   weightlift._core.populate_read  memory mapped onto files brought in
//                                before the load returns (read_ahead.h)
//
// GIL: released while waiting; both run on their own threads.
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "weightlift/destination.h"
#include "weightlift/read_ahead.h"

namespace wlpy {

namespace {

using namespace nb::literals;

std::unique_ptr<wl::ReadAhead> start(std::vector<std::string> files, int threads, uint64_t block_size,
                                     uint64_t max_memory, int rank, int world_size,
                                     std::optional<std::set<int64_t>> local_expert_ids,
                                     std::optional<std::vector<std::string>> only,
                                     std::optional<std::vector<std::string>> first) {
  wl::ReadAheadOptions o;
  o.threads = threads;
  o.block_size = block_size;
  o.max_memory = max_memory;
  o.rank = rank;
  o.world_size = world_size;
  o.local_experts = std::move(local_expert_ids);
  // Name sets (read by the job's threads only).
  auto names_in = [](const std::vector<std::string>& names) {
    auto set = std::make_shared<const std::unordered_set<std::string>>(names.begin(), names.end());
    return [set](std::string_view name) { return set->contains(std::string(name)); };
  };
  if (only) o.select = names_in(*only);   // these tensors alone
  if (first) o.first = names_in(*first);  // these before the others
  return unwrap(wl::ReadAhead::start(std::move(files), std::move(o)));
}

nb::dict progress_dict(const wl::ReadAheadProgress& p) {
  nb::dict d;
  d["bytes_planned"] = p.bytes_planned;
  d["bytes_cached"] = p.bytes_cached;
  d["bytes_read"] = p.bytes_read;
  d["bytes_capped"] = p.bytes_capped;
  d["bytes_consumed"] = p.bytes_consumed;
  d["bytes_helped"] = p.bytes_helped;
  d["overtaken"] = p.overtaken;
  d["overtaken_at"] = p.overtaken_at;
  d["planned"] = p.planned;
  d["done"] = p.done;
  d["remote"] = p.remote;
  d["seconds"] = p.seconds;
  return d;
}

nb::dict progress(const wl::ReadAhead& ra) { return progress_dict(ra.progress()); }

nb::dict wait_planned(const wl::ReadAhead& ra) {
  wl::ReadAheadProgress p;
  {
    nb::gil_scoped_release nogil;
    p = ra.wait_planned();
  }
  return progress_dict(p);
}

nb::dict populate(const std::vector<std::pair<uintptr_t, uint64_t>>& ranges, int threads) {
  std::vector<wl::MappedRange> rs;
  rs.reserve(ranges.size());
  for (auto& [data, size] : ranges) rs.push_back({reinterpret_cast<const std::byte*>(data), size});
  std::optional<wl::Result<wl::PopulateStats>> st;
  {
    nb::gil_scoped_release nogil;
    st.emplace(wl::populate_read(rs, threads));
  }
  wl::PopulateStats p = unwrap(std::move(*st));
  nb::dict d;
  d["bytes"] = p.bytes;
  d["bytes_not_resident"] = p.bytes_not_resident;
  d["seconds"] = p.seconds;
  return d;
}

}  // namespace

wl::Env* read_ahead_env(nb::handle h) {
  wl::ReadAhead* ra = nullptr;
  if (!nb::try_cast<wl::ReadAhead*>(h, ra) || ra == nullptr)
    throw nb::type_error(("engine option read_ahead takes a weightlift._core.ReadAhead (from "
                          "weightlift._engine.read_ahead), not " +
                          std::string(nb::type_name(h.type()).c_str()))
                             .c_str());
  return ra->env();
}

void bind_read_ahead(nb::module_& m) {
  nb::class_<wl::ReadAhead>(m, "ReadAhead")
      .def_static("start", &start, "files"_a, "threads"_a = 0, "block_size"_a = 0, "max_memory"_a = 0, "rank"_a = 0,
                  "world_size"_a = 1, "local_expert_ids"_a.none() = nb::none(), "only"_a.none() = nb::none(),
                  "first"_a.none() = nb::none(), nb::call_guard<nb::gil_scoped_release>())
      .def("progress", &progress)
      .def("wait_planned", &wait_planned,
           "progress() once the job has planned (its sizes known) or ended; the GIL released while waiting")
      .def(
          "wait",
          [](wl::ReadAhead& ra) {
            wl::Status s;
            {
              nb::gil_scoped_release nogil;
              s = ra.wait();
            }
            return s.ok() ? std::string() : s.to_string();
          },
          "the job's first failure as text ('' when none): the load reads those bytes itself")
      .def("stop", &wl::ReadAhead::stop);

  m.def("populate_read", &populate, "ranges"_a, "threads"_a = 0,
        "every page of [(address, bytes)] (memory mapped onto files) read in and mapped: "
        "{bytes, bytes_not_resident, seconds}; IOError naming the range when a file was truncated under it");

  nb::class_<wl::Prefaulter>(m, "Prefaulter")
      .def(nb::init<bool>(), "huge_pages"_a = false)
      .def(
          "add",
          [](wl::Prefaulter& p, uintptr_t data, uint64_t size) { p.add(reinterpret_cast<std::byte*>(data), size); },
          "data"_a, "size"_a)
      .def("stop", &wl::Prefaulter::stop, nb::call_guard<nb::gil_scoped_release>())
      .def("bytes_queued", &wl::Prefaulter::bytes_queued)
      .def("bytes_done", &wl::Prefaulter::bytes_done);
}

}  // namespace wlpy
