// Private to the extension: the engine's options as Python sees them
// (weightlift._core.LoadOptions), shared by the bindings that run a load
// (bind_engine.cpp: plans and dry runs; bind_stream.cpp; bind_load_into.cpp).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "bindings.h"
#include "weightlift/load_plan.h"

namespace wlpy {

// wl::LoadOptions with its enums as text; an unknown option is an AttributeError
// (weightlift turns it into a ValueError naming the option).
struct PyLoadOptions {
  wl::LoadOptions o;
  std::vector<std::string> rules;
  std::optional<std::set<int64_t>> experts;
  std::string device = "cpu";  // where tensors land: "cpu", "pinned", "cuda:N"
  std::string gds = "auto";    // GPUDirect Storage for CUDA: "auto", "on", "off"
  nb::object collective;       // a weightlift._core.Collective (bind_dist.cpp), or None
  nb::object read_ahead;  // a weightlift._core.ReadAhead (bind_read_ahead.cpp) whose staging the load reads, or None

  // The load's options with the device's destination (gpu::destination_for),
  // the collective and a read-ahead's Env in place; the returned owner keeps
  // the destination alive for the load (the caller keeps this object, and so
  // the collective and the read-ahead, alive). A device that cannot be used raises.
  std::shared_ptr<void> resolve(wl::LoadOptions& out) const;

  std::string strategy() const;
  void set_strategy(const std::string& s);
  std::string direct() const;
  void set_direct(const std::string& d);
  std::string order() const;
  void set_order(const std::string& s);
  void set_rules(const std::vector<std::string>& r);
  void set_experts(std::optional<std::set<int64_t>> ids);
  // {name: (begin, end)}: LoadOptions::rows (row selections, part of the plan).
  std::map<std::string, std::pair<int64_t, int64_t>> rows() const;
  void set_rows(const std::map<std::string, std::pair<int64_t, int64_t>>& rows);
};

// Names a load is limited to (`keep`) or must leave out.
void set_selection(wl::LoadOptions& o, const std::optional<std::vector<std::string>>& names, bool keep);

// The figures of a finished load (weightlift's stats dict).
nb::dict stats_dict(const wl::LoadStats& s);
// The plan's read path and reasons: what a load decided, for Python
// ("strategy", "direct", "file_views", "gds", "ordered", "max_memory",
// "threads", "read_size", "window", "copy_source", "workers", "log",
// "warnings" (the log lines that are warnings), "text" (describe())).
nb::dict plan_dict(const wl::LoadPlan& plan);

}  // namespace wlpy
