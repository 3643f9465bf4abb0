// weightlift/collective.h: the rank seam. N ranks load one checkpoint by
// reading it once in total from storage and exchanging bytes over an
// existing collective engine: torch.distributed (gloo, NCCL) from Python,
// MPI from the CLI, NCCL for device buffers. weightlift opens no sockets.
//
// A Collective is one process's handle on its group. Every method is a
// collective call: all ranks call it in the same order with matching sizes.
// A rank whose load fails keeps to the engine's protocol and reports its
// error at the next exchange, so every rank fails with the same message (see
// docs/distributed.md). A call that itself fails (a peer died, a timeout)
// leaves the group unusable: the engine then calls abort(), which makes the
// others' pending and later calls fail within the implementation's timeout
// rather than hang (MPI: the job is aborted).
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
  // carrying `why` (best effort: the implementation's timeout covers the rest).
  virtual void abort(const Status& why) = 0;

  // Device collectives only (device() not host-accessible); the engine never
  // calls these on a host collective. n bytes of exchange memory on device(),
  // freed when the last copy of the pointer goes.
  virtual Result<std::shared_ptr<std::byte>> allocate(uint64_t n) {
    (void)n;
    return Status::Unimplemented("this collective exchanges host memory");
  }
  // Copies n bytes between any two memories (host, pinned or device, as each
  // side's Device says) and waits for the copy.
  virtual Status copy(std::byte* dst, Device dst_device, const std::byte* src, Device src_device, uint64_t n) {
    (void)dst, (void)dst_device, (void)src, (void)src_device, (void)n;
    return Status::Unimplemented("this collective exchanges host memory");
  }
};

// Every call waits at most this long for the other ranks by default.
inline constexpr std::chrono::seconds kDefaultCollectiveTimeout{600};

// MPI_COMM_WORLD, initialising MPI when needed (the CLI's --distributed
// under mpirun). MPI lives in libweightlift_mpi.so (src/dist/mpi/, built when
// MPI is found), loaded on first use like the CUDA backend, so one build runs
// with or without MPI: kUnavailable when the library or MPI is missing.
// Calls are MPI's blocking collectives under a watchdog: one that waits
// longer than `timeout` for the other ranks prints why and ends the process,
// and mpirun then ends the job. MPI is finalized when the last Collective
// from here is destroyed.
Result<std::unique_ptr<Collective>> mpi_world(std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

// An NCCL communicator the caller made (an ncclComm_t, e.g. torch's or
// cupy's, handed in from Python) on CUDA device `device`, its collectives
// queued on `stream` (a cudaStream_t; null: a stream of its own). NCCL and
// the CUDA runtime come from the GPU component's function table (gpu.h:
// dlopen'd, or the host fake); kUnavailable without them or a device. The
// communicator stays the caller's; a call that does not complete within
// `timeout` aborts it (ncclCommAbort). The communicator's device pointers
// are the collective's exchange memory (allocate(), copy()).
Result<std::unique_ptr<Collective>> nccl_collective(void* comm, void* stream, int device,
                                                    std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

// What each rank wants from the load.
// The engine infers it from LoadOptions: shard_rules set means kShard, and
// local_experts (which may differ by rank) further drops other ranks' experts.
enum class RankResult {
  kReplica,  // every tensor, whole, on every rank
  kShard,    // tensors matching a shard rule: only this rank's slice
             // (LoadOptions.tp_rank = rank, tp_size = world); others whole
};

}  // namespace wl
