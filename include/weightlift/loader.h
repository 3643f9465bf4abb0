// weightlift/loader.h: the loading engine. Every tensor of a checkpoint (or
// this rank's part of it) is materialized into memory the caller then owns
// and handed to `sink` as soon as it is complete.
//
// Strategies (all give identical bytes; see docs/engine.md):
//   lazy      mmap each file, copy each tensor out of the mapping (safe_open)
//   eager     read each file whole with one read, tensors view that buffer
//   prefetch  warm the page cache in the background (threads, block size,
//             files striped by rank), then lazy
//   auto      prefetch on a network filesystem when the checkpoint fits in 90%
//             of available RAM, else lazy; the reason goes to `log`
//   threads   N workers each loading whole files; at most N files in memory
//   stream    all files as one byte stream split across N I/O threads in large
//             aligned chunks (O_DIRECT when the page cache is cold), each tensor
//             handed over when its last byte lands, under a memory cap
//
// Ownership: a LoadedTensor's view owns (shares) its bytes, except when a
// `destination` callback supplied them (then the caller owns them and the
// view's owner is null). No view ever points into a buffer the loader reuses.
// Threading: load_files() blocks; `sink` and `progress` are called from one
// thread at a time (possibly different threads), in no promised order across
// files (file order for lazy/eager/prefetch/auto).
// Non-safetensors files (.bin/.pt/.npy) go through CheckpointReader.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/shard.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

enum class Strategy { kLazy, kEager, kPrefetch, kAuto, kThreads, kStream };

// "lazy", "eager", "prefetch", "auto", "threads", "stream"; nullopt when unknown.
std::optional<Strategy> strategy_from_name(std::string_view name);
std::string_view strategy_name(Strategy s);

struct LoadedTensor {
  std::string name;
  std::string file;
  TensorView view;  // this rank's bytes: the shard's shape when a shard rule matched
  Shape full_shape; // the tensor's shape in the file
  uint64_t ordinal = 0;  // position in checkpoint order (file order, then offset order)
};

struct LoadProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t tensors_done = 0, tensors_total = 0;
  uint64_t files_done = 0, files_total = 0;
};

// What a destination callback is asked for.
struct TensorRequest {
  std::string name;
  DType dtype = DType::U8;
  Shape shape;          // of the bytes to write (the shard's shape)
  uint64_t nbytes = 0;
};

enum class DirectIo { kAuto, kOn, kOff };

struct LoadOptions {
  Strategy strategy = Strategy::kAuto;
  Env* env = Env::Default();
  // Called after each tensor; return false to cancel (the load fails with kCancelled).
  std::function<bool(const LoadProgress&)> progress;
  // Log lines (auto decision, prefetch progress, fallbacks). May be empty.
  std::function<void(const std::string&)> log;

  // Workers: prefetch/threads/stream. 0 picks the strategy's default (8).
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
  DirectIo direct = DirectIo::kAuto;
  // stream (and every strategy): when set, each tensor's bytes go into the
  // span this returns (exactly nbytes); the caller keeps it alive.
  std::function<Result<std::span<std::byte>>(const TensorRequest&)> destination;

  // Injectable system files for `auto`.
  std::string mounts_path = "/proc/mounts";
  std::string meminfo_path = "/proc/meminfo";
};

struct LoadStats {
  uint64_t tensors = 0;          // handed to the sink
  uint64_t bytes = 0;            // their bytes
  uint64_t skipped_tensors = 0;  // by the expert filter
  uint64_t bytes_read = 0;       // from files (stream: with alignment slack)
  double seconds = 0;
  Strategy strategy = Strategy::kLazy;  // what ran (auto resolves to prefetch or lazy)
  bool direct_io = false;               // stream used O_DIRECT
};

// Loads the tensors of the given weight files (any CheckpointReader format).
Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& options,
                             const std::function<Status(LoadedTensor&&)>& sink);

// The weight files a user means by PATH: a file is itself; a folder gives the
// files its model.safetensors.index.json names, else its *.safetensors in natural order.
Result<std::vector<std::string>> resolve_weight_files(const std::string& path, Env* env = Env::Default());

// Peak resident set size of this process, in bytes (VmHWM).
uint64_t peak_rss_bytes();

}  // namespace wl
