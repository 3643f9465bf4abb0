// Private: the strategy runners. Each reads the plan's bytes into the
// destination along the read path choose() picked (read_path.h) and
// delivers every tensor through `d`.
#pragma once

#include "engine/delivery.h"
#include "engine/plan.h"
#include "weightlift/read_path.h"

namespace wl::engine {

// lazy: one file at a time, each tensor read on its own (mapping for shards).
Status run_lazy(Plan& plan, const LoadOptions& o, const ReadPath& path, Destination& dest, Delivery& d,
                LoadStats& stats);
// eager: one file at a time, read whole with one read.
Status run_eager(Plan& plan, const LoadOptions& o, const ReadPath& path, Destination& dest, Delivery& d,
                 LoadStats& stats);
// threads: N workers each loading whole files (eager).
Status run_threads(Plan& plan, const LoadOptions& o, const ReadPath& path, Destination& dest, Delivery& d,
                   LoadStats& stats);
// prefetch: a background page-cache prefetch, then lazy.
Status run_prefetch(Plan& plan, const std::vector<std::string>& files, const LoadOptions& o, const ReadPath& path,
                    Destination& dest, Delivery& d, LoadStats& stats);
// stream: every selected byte range as one stream over N I/O threads
// (path.direct: O_DIRECT; path.gds: cuFile into device memory; path.max_memory: the cap).
Status run_stream(Plan& plan, const LoadOptions& o, const ReadPath& path, Destination& dest, Delivery& d,
                  LoadStats& stats);

// Distributed (o.collective set): the ranks read the plan's bytes once in
// total and exchange them (rank_plan.h); reads go through run_stream.
Result<LoadStats> run_distributed(const std::vector<std::string>& files, const LoadOptions& o,
                                  const std::function<Status(LoadedTensor&&)>& sink);

// The whole load: the plan, the read path (choose()), then its strategy.
Result<LoadStats> run_load(const std::vector<std::string>& files, const LoadOptions& o,
                           const std::function<Status(LoadedTensor&&)>& sink);

}  // namespace wl::engine
