// Private: the load plan shared by every strategy. Which tensors of which
// files are read (after the expert filter), and which bytes of each (shard
// layout), plus the delivery point (sink + progress, serialized).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/checkpoint.h"
#include "weightlift/loader.h"
#include "weightlift/shard.h"

namespace wl::engine {

struct PlannedTensor {
  size_t file = 0;   // index into Plan::files
  size_t index = 0;  // index in the file's CheckpointReader
  std::string name;
  DType dtype = DType::U8;
  Shape full_shape;
  Shape shape;        // to deliver
  uint64_t nbytes = 0;  // to deliver
  uint64_t full_nbytes = 0;  // the whole tensor in the file
  std::optional<uint64_t> file_offset;  // contiguous storage in the file
  std::optional<ShardLayout> shard;
  uint64_t ordinal = 0;
};

// Only the first kKeepOpen files keep their reader (a descriptor and a
// mapping each) between planning and loading; the rest reopen on demand, so
// checkpoints with thousands of shards stay under the descriptor limit.
inline constexpr size_t kKeepOpen = 64;

struct PlanFile {
  std::string path;
  std::unique_ptr<CheckpointReader> reader;  // may be null: see reader_of()
  std::vector<size_t> tensors;  // indices into Plan::tensors, in file-offset order
};

struct Plan {
  std::vector<PlanFile> files;
  std::vector<PlannedTensor> tensors;
  uint64_t bytes_total = 0;
  uint64_t skipped = 0;
};

Result<Plan> make_plan(const std::vector<std::string>& files, const LoadOptions& o);
// The file's reader, reopened when it was closed after planning.
Result<CheckpointReader*> reader_of(PlanFile& pf, Env* env);

// Serializes sink and progress calls; tracks cancellation and the first error.
class Delivery {
 public:
  Delivery(const LoadOptions& o, const std::function<Status(LoadedTensor&&)>& sink, const Plan& plan)
      : o_(o), sink_(sink) {
    p_.bytes_total = plan.bytes_total;
    p_.tensors_total = plan.tensors.size();
    p_.files_total = plan.files.size();
  }
  // Hands one finished tensor over. Thread-safe.
  Status deliver(const PlannedTensor& t, const std::string& file, TensorView view);
  void file_done() {
    std::lock_guard lk(mu_);
    p_.files_done++;
  }
  void fail(Status s) {
    std::lock_guard lk(mu_);
    if (status_.ok()) status_ = std::move(s);
    stop_.store(true);
  }
  bool stopped() const { return stop_.load(std::memory_order_relaxed); }
  Status status() const {
    std::lock_guard lk(mu_);
    return status_;
  }
  uint64_t tensors() const { return p_.tensors_done; }
  uint64_t bytes() const { return p_.bytes_done; }

 private:
  const LoadOptions& o_;
  const std::function<Status(LoadedTensor&&)>& sink_;
  mutable std::mutex mu_;
  LoadProgress p_;
  Status status_;
  std::atomic<bool> stop_{false};
};

// Bytes of one planned tensor as a TensorView: the owned buffer, or the
// caller's destination. `fill` writes exactly t.nbytes bytes into dst.
Result<TensorView> materialize(const PlannedTensor& t, const LoadOptions& o,
                               const std::function<Status(std::span<std::byte>)>& fill);

// The stream strategy.
Status run_stream(Plan& plan, const LoadOptions& o, Delivery& d, LoadStats& stats);

}  // namespace wl::engine
