// weightlift/collective.h: the rank seam. N ranks load one checkpoint by
// reading it once in total from storage and exchanging bytes over an
// existing collective engine: torch.distributed (gloo, NCCL) from Python,
// MPI from the CLI, NCCL for device buffers. weightlift opens no sockets.
//
// A Collective is one process's handle on its group. Every method is a
// collective call: all ranks call it in the same order with matching sizes;
// a rank that fails calls abort() instead, which makes the others' pending
// and later calls fail (kAborted) within `timeout` rather than hang.
// Threading: called from one engine thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weightlift/device.h"
#include "weightlift/status.h"

namespace wl {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where exchanged buffers must live (kCpu for gloo and MPI, kCuda for NCCL).
  virtual Device device() const = 0;

  // buf holds world_size() blocks of `block` bytes; rank r has filled block r.
  // Afterwards every rank holds all blocks (an in-place all-gather).
  virtual Status all_gather(std::byte* buf, uint64_t block) = 0;
  // root's n bytes at buf to every rank.
  virtual Status broadcast(std::byte* buf, uint64_t n, int root) = 0;
  // Small control messages (statuses, header digests): every rank's string,
  // indexed by rank. Sizes may differ across ranks.
  virtual Result<std::vector<std::string>> all_gather_strings(const std::string& mine) = 0;
  // Makes every other rank's pending and later calls fail with kAborted
  // carrying `why` (best effort: the engine's own timeout covers the rest).
  virtual void abort(const Status& why) = 0;
};

// MPI_COMM_WORLD, initialising MPI when needed (the CLI's --distributed
// under mpirun). kUnavailable when this build or machine has no MPI.
Result<std::unique_ptr<Collective>> mpi_world();

// What each rank wants from the load.
enum class RankResult {
  kReplica,       // every tensor, whole, on every rank
  kShard,         // tensors matching a shard rule: only this rank's slice
                  // (LoadOptions.tp_rank = rank, tp_size = world); others whole
};

}  // namespace wl
