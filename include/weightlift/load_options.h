// weightlift/load_options.h: the loading engine's vocabulary -- what a load
// is asked to do (LoadOptions), what it hands over (LoadedTensor), how far it
// got (LoadProgress) and what ran (LoadStats). A load is planned from these
// options and carried out (load_plan.h); load_files() (loader.h) does both.
// The options are wishes: how a load reads is decided by its plan
// (choose(), read_path.h), never by the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/collective.h"
#include "weightlift/destination.h"
#include "weightlift/io.h"
#include "weightlift/read_path.h"
#include "weightlift/shard.h"
#include "weightlift/status.h"
#include "weightlift/switches.h"
#include "weightlift/system.h"
#include "weightlift/tensor.h"

namespace wl {

struct LoadedTensor {
  std::string name;
  std::string file;
  TensorView view;       // this rank's bytes: the shard's shape when a shard rule matched
  Shape full_shape;      // the tensor's shape in the file
  uint64_t ordinal = 0;  // position in checkpoint order (file order, then offset order)
};

struct LoadProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t tensors_done = 0, tensors_total = 0;
  uint64_t files_done = 0, files_total = 0;
};

struct LoadOptions {
  Strategy strategy = Strategy::kAuto;
  Env* env = Env::Default();
  // Called after each tensor; return false to cancel (the load fails with kCancelled).
  std::function<bool(const LoadProgress&)> progress;
  // Log lines (auto decision, prefetch progress, fallbacks). May be empty.
  std::function<void(const std::string&)> log;

  // Workers: prefetch/threads/stream. 0 picks the strategy's default (8;
  // stream: up to 8 for local files, 16 connections for remote sources).
  int threads = 0;
  // Prefetch block size / stream read size in bytes. 0 picks the default (16 MiB / 8 MiB).
  uint64_t block_size = 0;
  // Data-parallel striping of prefetch: this process prefetches files[rank::world_size].
  int rank = 0, world_size = 1;

  // Tensor parallelism: tensors matching a rule are read only for this rank.
  int64_t tp_rank = 0, tp_size = 1;
  std::vector<ShardRule> shard_rules;
  // Expert parallelism: expert weights whose id is not here are skipped unread.
  std::optional<std::set<int64_t>> local_experts;

  // stream: cap in bytes on the loader's own memory (staging buffers plus
  // tensors allocated but not yet handed over; a single larger tensor is
  // always allowed). 0 = no cap beyond threads x block_size of staging.
  uint64_t max_memory = 0;
  // stream: O_DIRECT. kAuto uses it when under half of a sample of the
  // files' pages is in the page cache.
  Toggle direct = Toggle::kAuto;
  // Where each tensor's bytes go (not owned). nullptr: host memory of the
  // engine's choosing (it may then share one buffer between the tensors of a
  // file: eager, threads; of a load: distributed). Every strategy honours it; the engine calls its
  // reserve() with every planned tensor before the first allocate(). With a
  // device destination (gpu.h) every strategy runs as the stream strategy,
  // the one that overlaps reads with copies and uses GPUDirect Storage (lazy,
  // eager and prefetch keep their file order through `ordered`; `log` says
  // so; WEIGHTLIFT_DEVICE_STRATEGY=asked runs the strategy as asked).
  Destination* destination = nullptr;
  // The sink sees tensors in checkpoint order (LoadedTensor::ordinal 0, 1,
  // ...) whatever the strategy: a tensor finished early waits until its
  // predecessors are handed over (outside the max_memory accounting).
  bool ordered = false;

  // With destination == nullptr, lazy / eager / prefetch / auto / threads:
  // every tensor stored whole and contiguously in its file is handed over as
  // a zero-copy view of a private copy-on-write mapping of the file (writable;
  // a write copies the page for this process and never reaches the file),
  // its pages mapped in by the engine (read faults, no copy; lazy: tensor by
  // tensor, right after each is queued; eager: the whole file before its
  // first tensor, unless 90% of it is in the page cache already) and dropped
  // from this process when the last view of the tensor dies. No fresh memory
  // is touched. Shards and non-contiguous tensors are copied as before; the
  // stream strategy always reads into memory. Files that are mostly not in
  // the page cache (under half of a sample of their pages) are read by the
  // stream strategy instead (O_DIRECT when it can, capped at max_memory or
  // 256 MiB): the tensors then own memory of their own, and may be handed
  // over out of checkpoint order (LoadedTensor::ordinal tells it).
  bool file_views = false;
  // With file_views: false hands each view over with its pages neither read
  // nor mapped (no readahead hint, no populate): the first access reads them,
  // or the caller brings them in when it chooses (populate_read in
  // read_ahead.h). For a caller that keeps views for later and reads them
  // in on a thread of its own (the vLLM plug-in's mapped parameters).
  bool populate_views = true;

  // The order in which each file's tensors are handed over (files stay in
  // the given order for lazy / eager / prefetch / auto):
  //   kOffset  storage (offset) order: one sequential pass
  //   kName    names sorted, as safetensors' safe_open().keys()
  //   kListed  the file's own listing order (a PyTorch file's pickle order)
  enum class Order { kOffset, kName, kListed };
  Order order = Order::kOffset;

  // When set, only tensors it accepts are planned (the others are never read).
  std::function<bool(std::string_view name)> select;
  // Row selections: a tensor named here is read and handed over as rows
  // [begin, end) of its first dimension (shape[0] = end - begin), those bytes
  // alone, as a shard rule along dim 0 reads a rank's part (safetensors'
  // prefetch plans). Rows outside the dimension, a 0-d tensor, or a tensor a
  // shard rule also matches fail the load before anything is read
  // (kInvalidArgument naming it). Empty: every tensor whole.
  std::map<std::string, RowRange, std::less<>> rows;

  // Distributed loading (not owned): the ranks of `collective` read the
  // checkpoint once in total and exchange over it (docs/distributed.md).
  // Every rank calls load_files with the same files (same headers; paths may
  // differ), and the same shard_rules; local_experts may differ by rank. The
  // reads always stream (strategy is ignored); with shard_rules each rank
  // keeps its own shard (tp_rank/tp_size must then be rank/world or be left
  // at 0/1). Each rank contributes 4 x block_size bytes per exchange round
  // (32 MiB by default; at most max_memory / 4 / world). One rank's failure
  // fails every rank with a message naming it. nullptr: this process reads
  // everything it delivers.
  Collective* collective = nullptr;

  // The system facts `auto` and the memory policy consult.
  SystemInfo* system = SystemInfo::Default();

  // The read path's A/B switches (switches.h), as the environment set them
  // when these options were made.
  Switches switches = read_switches();

  // Facts the caller already holds (a dry run's: Python's patchable
  // filesystem helpers, which vLLM's tests replace): they win over what the
  // plan would find out (read_path.h's ReadFacts).
  struct KnownFacts {
    std::optional<std::string> fs_type;
    std::optional<uint64_t> checkpoint_bytes, available_bytes;
    std::optional<std::optional<double>> cached_fraction;  // {nullopt}: residency given as unknown
  };
  KnownFacts known;
};

struct LoadStats {
  uint64_t tensors = 0;                 // handed to the sink
  uint64_t bytes = 0;                   // their bytes
  uint64_t skipped_tensors = 0;         // by the expert filter
  uint64_t bytes_read = 0;              // from files (stream: with alignment slack)
  double seconds = 0;                   // planning and carrying out
  Strategy strategy = Strategy::kLazy;  // what ran (auto resolves to stream, prefetch or lazy)
  bool direct_io = false;               // stream used O_DIRECT
  bool gds = false;                     // stream read into device memory with GPUDirect Storage
  bool host_registered = false;         // stream copied to the device straight out of the page cache
  // Distributed: bytes this rank received from the others over the
  // collective (their exchange blocks, padding included).
  uint64_t bytes_exchanged = 0;
};

}  // namespace wl
