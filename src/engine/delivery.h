// Private: handing finished tensors to the caller (sink + progress,
// serialized), and putting bytes into destination regions.
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
// With LoadOptions::ordered, tensors that finish early wait here until every
// tensor before them (by ordinal) has been handed over.
class Delivery {
 public:
  Delivery(const LoadOptions& o, const std::function<Status(LoadedTensor&&)>& sink, const Plan& plan);
  // Progress totals given (bytes_total, tensors_total, files_total; the rest ignored).
  Delivery(const LoadOptions& o, const std::function<Status(LoadedTensor&&)>& sink, const LoadProgress& totals);
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
  const LoadOptions& o_;
  const std::function<Status(LoadedTensor&&)>& sink_;
  mutable std::mutex mu_;
  LoadProgress p_;
  Status status_;
  std::atomic<bool> stop_{false};
  std::function<void()> on_stop_;
  uint64_t next_ordinal_ = 0;
  std::map<uint64_t, Held> held_;  // ordered: finished, waiting for their predecessors
};

// Counts asynchronous copies still in flight; the first error wins. (Also
// the GPU uploader's count of one load's submissions, src/gpu/ring.h.)
class PendingCopies {
 public:
  void add(int n = 1);
  void done(const Status& s);
  Status wait();
  // Waits, then forgets the error.
  void reset();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
  Status first_;
};

// The memory a planned tensor's bytes go to: the destination's region,
// checked to be exactly t.nbytes (and device memory to come with an uploader).
Result<Region> place(const PlannedTensor& t, Destination& dest);
// The view to deliver once the region is filled.
TensorView view_of(const PlannedTensor& t, const Region& r);

// Writes host bytes into a region at `offset`: memcpy for host memory, the
// destination's Uploader for device memory (staged through its ring; waits
// for the copies).
Status write_region(Destination& dest, const Region& r, uint64_t offset, std::span<const std::byte> src);
// Reads n bytes of `file` at file_offset into a region at `offset`: straight
// into host memory; through the Uploader's slots for device memory, the
// copies counted in `pending` (wait on it before delivering).
Status read_region(Destination& dest, const Region& r, uint64_t offset, const RandomAccessFile& file,
                   uint64_t file_offset, uint64_t n, PendingCopies& pending);

// Copies this rank's bytes of `full` (the whole tensor, host memory) into
// the region: the shard's runs when t.shard, else all of it. Device memory
// is filled through the Uploader's slots (no host copy of the tensor).
Status copy_shard(Destination& dest, const PlannedTensor& t, const Region& r, std::span<const std::byte> full);

// The engine's default destination when the caller gives none.
Destination& default_destination();

}  // namespace wl::engine
