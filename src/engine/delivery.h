// Private: handing finished tensors to the caller (sink + progress,
// serialized), and a planned tensor's memory in its destination (the bytes
// go in through destination.h's write_region / read_region).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include "engine/plan.h"
#include "weightlift/destination.h"
#include "weightlift/load_options.h"

namespace wl::engine {

// Serializes sink and progress calls; tracks cancellation and the first error.
// In checkpoint order (the plan's ordered()), tensors that finish early wait
// here until every tensor before them (by ordinal) has been handed over.
class Delivery {
 public:
  using Progress = std::function<bool(const LoadProgress&)>;
  // `progress` may be empty; `ordered`: checkpoint order (see above).
  Delivery(Progress progress, bool ordered, const std::function<Status(LoadedTensor&&)>& sink, const Plan& plan);
  // Progress totals given (bytes_total, tensors_total, files_total; the rest ignored).
  Delivery(Progress progress, bool ordered, const std::function<Status(LoadedTensor&&)>& sink,
           const LoadProgress& totals);
  // Hands one finished tensor over. Thread-safe.
  Status deliver(const PlannedTensor& t, const std::string& file, TensorView view);
  void file_done();
  void fail(Status s);
  bool stopped() const { return stop_.load(std::memory_order_relaxed); }
  // `f` runs once, when the load first stops (an error, a cancel); under the
  // delivery's lock, so it must not call back into the Delivery.
  void on_stop(std::function<void()> f);
  Status status() const;
  uint64_t tensors() const;
  uint64_t bytes() const;

 private:
  struct Held {
    const PlannedTensor* t;
    std::string file;
    TensorView view;
  };
  Status emit_locked(const PlannedTensor& t, const std::string& file, TensorView view);
  void stop_locked(Status s);
  const Progress progress_;
  const bool ordered_;
  const std::function<Status(LoadedTensor&&)>& sink_;
  mutable std::mutex mu_;
  LoadProgress p_;
  Status status_;
  std::atomic<bool> stop_{false};
  std::function<void()> on_stop_;
  uint64_t next_ordinal_ = 0;
  std::map<uint64_t, Held> held_;  // ordered: finished, waiting for their predecessors
};

// The memory a planned tensor's bytes go to: the destination's region,
// checked to be exactly t.nbytes (and device memory to come with an uploader).
Result<Region> place(const PlannedTensor& t, Destination& dest);
// The view to deliver once the region is filled.
TensorView view_of(const PlannedTensor& t, const Region& r);

// Copies this rank's bytes of `full` (the whole tensor, host memory) into
// the region: the shard's runs when t.shard, else all of it. Device memory
// is filled through the Uploader's slots (no host copy of the tensor).
Status copy_shard(Destination& dest, const PlannedTensor& t, const Region& r, std::span<const std::byte> full);

// The engine's default destination when the caller gives none.
Destination& default_destination();

}  // namespace wl::engine
