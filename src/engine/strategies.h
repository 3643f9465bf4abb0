// Private: the runners. Each carries a plan out (load_plan.h): it reads the
// plan's bytes into its destination along the plan's read path and delivers
// every tensor through `d`. They read only the plan: no options, no
// environment, nothing decided again.
#pragma once

#include <functional>

#include "engine/delivery.h"
#include "engine/load_plan.h"

namespace wl::engine {

// lazy: one file at a time, each tensor read on its own (mapping for shards).
Status run_lazy(const LoadPlan& plan, Delivery& d, LoadStats& stats);
// eager: one file at a time, read whole with one read.
Status run_eager(const LoadPlan& plan, Delivery& d, LoadStats& stats);
// threads: path.workers workers each loading whole files (eager).
Status run_threads(const LoadPlan& plan, Delivery& d, LoadStats& stats);
// prefetch: a background page-cache prefetch, then lazy.
Status run_prefetch(const LoadPlan& plan, Delivery& d, LoadStats& stats);
// stream: every selected byte range as one stream over path.stream's threads
// (path.direct: O_DIRECT; path.gds: cuFile into device memory; the window
// and copy source as planned).
Status run_stream(const LoadPlan& plan, Delivery& d, LoadStats& stats);

// Distributed (plan.body().exchange): this rank's own tensors streamed while
// the shared stream is read in slices and exchanged, round by round
// (distributed.cpp).
Result<LoadStats> run_distributed(const LoadPlan& plan, const std::function<Status(LoadedTensor&&)>& sink);

// plan_load()'s distributed part: every rank plans, says hello (its status,
// the headers' digests, its shard rules, experts and exchange block wish),
// and all agree or all fail; then the rank plan. `facts` are this rank's.
Status plan_distributed(const std::vector<std::string>& files, const LoadOptions& o, LoadPlan::Body& b);

}  // namespace wl::engine
