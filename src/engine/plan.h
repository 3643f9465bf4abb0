// Private: the load plan every strategy runs. Which tensors of which files
// are read (after the expert filter), which bytes of each (shard layout), and
// which version of each file (so that reopening a file can never mix the
// planned header with another version's data).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/checkpoint.h"
#include "weightlift/destination.h"
#include "weightlift/load_options.h"
#include "weightlift/shard.h"

namespace wl::engine {

// shape, nbytes: what is delivered (this rank's shard when a rule matched).
struct PlannedTensor : TensorMeta {
  size_t file = 0;   // index into Plan::files
  size_t index = 0;  // index in the file's CheckpointReader
  Shape full_shape;
  uint64_t full_nbytes = 0;             // the whole tensor in the file
  std::optional<uint64_t> file_offset;  // contiguous storage in the file
  std::optional<ShardLayout> shard;
  uint64_t ordinal = 0;

  TensorRequest request() const { return {TensorMeta(*this), ordinal}; }
};

// Only the first kKeepOpen files keep their reader (a descriptor and a
// mapping each) between planning and loading; the rest reopen on demand, so
// checkpoints with thousands of shards stay under the descriptor limit.
inline constexpr size_t kKeepOpen = 64;

struct PlanFile {
  std::string path;
  std::string version;  // RandomAccessFile::version() when planned
  // SHA-256 of the header's tensor table (names, dtypes, shapes, sizes,
  // offsets): equal on every rank that opened the same checkpoint.
  std::string digest;
  // The open reader, a cache (may be null: see reader_of()); a runner closes
  // it when its file is done, through a const plan.
  mutable std::unique_ptr<CheckpointReader> reader;
  std::vector<size_t> tensors;  // indices into Plan::tensors, in file-offset order
};

struct Plan {
  std::vector<PlanFile> files;
  std::vector<PlannedTensor> tensors;
  uint64_t bytes_total = 0;
  uint64_t skipped = 0;
};

Result<Plan> make_plan(const std::vector<std::string>& files, const LoadOptions& o);
// The file's reader, reopened (same version, else kAborted) when it was
// closed after planning. One thread at a time per file.
Result<CheckpointReader*> reader_of(const PlanFile& pf, Env* env);
// The file opened again for reading its data; kAborted when it is no longer
// the version that was planned.
Result<std::shared_ptr<RandomAccessFile>> open_data(const PlanFile& pf, Env* env, FileMode mode);

}  // namespace wl::engine
