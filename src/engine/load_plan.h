// Private: the engine's side of a LoadPlan (weightlift/load_plan.h): the
// tensors to read, the read path, the handles the runners use, and for a
// distributed load the agreement of the ranks and the rank plan. Runners get
// `const LoadPlan&` and read this; nothing here is decided after plan_load().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/plan.h"
#include "engine/rank_plan.h"
#include "weightlift/load_plan.h"

namespace wl::engine {

// A distributed load as the ranks agreed on it (every rank computes the same
// rank plan from the same hellos).
struct Exchange {
  int world = 1, me = 0;
  std::vector<size_t> order;                              // rank-plan index -> Plan tensor index
  std::vector<std::optional<std::set<int64_t>>> experts;  // per rank
  uint64_t block = 0;                                     // the smallest of the ranks' wishes
  bool arena = false;                                     // every rank receives straight into one engine buffer
  RankPlan rp;
  std::vector<char> want;  // by rank-plan index: this rank keeps it
  LoadProgress totals;     // what this rank hands over
  uint64_t skipped = 0;    // tensors the expert filter leaves to other ranks
  LoadPlan own;            // this rank's own tensors (its shards, those only it keeps), streamed
};

}  // namespace wl::engine

namespace wl {

struct LoadPlan::Body {
  engine::Plan plan;               // the tensors, their byte ranges, each file's version
  std::vector<std::string> files;  // as given (the prefetcher reads them)
  ReadPath path;
  bool ordered = false;  // the sink sees checkpoint order
  // The options' handles (not owned) and the prefetcher's striping.
  Env* env = nullptr;
  SystemInfo* system = nullptr;
  Destination* destination = nullptr;  // nullptr: the engine's host memory
  Collective* collective = nullptr;
  std::function<bool(const LoadProgress&)> progress;
  std::function<void(const std::string&)> log;
  int rank = 0, world_size = 1;
  std::vector<std::string> lines;              // log()
  double seconds = 0;                          // planning
  std::unique_ptr<engine::Exchange> exchange;  // distributed
};

}  // namespace wl

namespace wl::engine {

// The destination the plan's tensors land in.
Destination& destination_of(const LoadPlan::Body& b);

// The plan a read-ahead of a later load of `files` with `options` works from
// (read_ahead.h): the tensors that load plans, in its stream order, and the
// read-ahead's sizes (ReadPath::read_ahead). Plan now, execute later.
Result<LoadPlan> plan_read_ahead(const std::vector<std::string>& files, const LoadOptions& options);

}  // namespace wl::engine
