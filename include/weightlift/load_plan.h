// weightlift/load_plan.h: a load decided once, as a value, then carried out.
//
//   plan_load(files, options) -> LoadPlan      everything a load decides
//   execute(plan, sink)       -> LoadStats     the runners carry it out
//   load_files(...)  (loader.h)                the two together
//
// What goes in: the files; LoadOptions (the caller's wishes: strategy,
// threads, read size, memory cap, O_DIRECT, file views, order, selection,
// shards and experts; the A/B switches; the handles: Env, SystemInfo,
// destination, collective, progress and log callbacks); and the facts
// choose() asks for while planning (page-cache residency, the filesystem,
// memory, cores, the destination's uploader and GPUDirect Storage, files a
// source is still writing).
// What comes out: the tensors to read (this rank's part of each, the byte
// ranges, the version of every file), the ReadPath (read_path.h: strategy,
// O_DIRECT, GDS, file views, checkpoint order, where device copies read
// from, threads, read size, memory window and staging, a distributed load's
// exchange block and memory split) and the reasons, in order (log()).
//
// plan_load() reads the files' headers and asks choose() once; nothing
// after it decides anything: the runners read only the plan (no options, no
// environment). A distributed plan (options.collective) is made by every
// rank together: each plans, then all agree (the headers, the shard rules,
// the exchange block) or all fail alike, naming the rank that failed, before
// a byte is exchanged; execute() must then be called on every rank.
//
// Lifetimes: the plan keeps the options' handles (env, system, destination,
// collective, callbacks), not owned: they must outlive execute(). It keeps
// the readers of the first files open (a descriptor each); execute() closes
// them as their files are done and reopens on demand (same version).
// Threading: plan_load() and execute() block; a plan is executed by one
// execute() at a time (it may be executed again afterwards).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "weightlift/load_options.h"
#include "weightlift/read_path.h"
#include "weightlift/status.h"

namespace wl {

class LoadPlan {
 public:
  LoadPlan();
  ~LoadPlan();
  LoadPlan(LoadPlan&&) noexcept;
  LoadPlan& operator=(LoadPlan&&) noexcept;

  // What will be read (this rank's part).
  size_t file_count() const;
  size_t tensor_count() const;
  uint64_t bytes() const;            // the tensors' bytes to hand over
  uint64_t skipped_tensors() const;  // by the expert filter
  // How: the read path choose() gave (never kAuto), after a distributed
  // load's agreement (exchange_block: the one every rank uses).
  const ReadPath& path() const;
  // Whether the sink sees checkpoint order (asked, or the path keeps it).
  bool ordered() const;
  // The reasons, in the order the rules fired, and the readers' setup
  // ("stream: 8 threads, ..."): what plan_load() gave options.log.
  const std::vector<std::string>& log() const;
  // The plan in words: one line of what is read, one of how, then log().
  std::string describe() const;

  // The engine's side (src/engine/load_plan.h): what the runners read.
  struct Body;
  const Body& body() const { return *body_; }
  explicit LoadPlan(std::unique_ptr<Body> body);

 private:
  std::unique_ptr<Body> body_;
};

// Plans a load of the given weight files (any CheckpointReader format; paths
// or URLs, through options.env): the options checked, the headers read, the
// read path chosen. Errors: bad options (kInvalidArgument), a file that
// cannot be opened or parsed (naming it), a rule's refusal (read_path.h);
// distributed, any rank's failure.
Result<LoadPlan> plan_load(const std::vector<std::string>& files, const LoadOptions& options);

// Carries the plan out: every tensor into the destination, handed to `sink`
// as soon as it is complete (loader.h's contract). LoadStats::seconds counts
// the planning too.
Result<LoadStats> execute(const LoadPlan& plan, const std::function<Status(LoadedTensor&&)>& sink);

}  // namespace wl
