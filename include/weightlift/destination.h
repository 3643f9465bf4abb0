// weightlift/destination.h: where the engine puts each tensor's bytes.
//
// The planner and the readers are the same for every destination; only where
// bytes land changes:
//   host (pageable)   the engine reads straight into the tensor's memory
//   pinned host       the same, into page-locked memory (fast later H2D copies)
//   CUDA device       the engine reads into a small pinned staging ring and
//                     the destination's Uploader copies each chunk to the
//                     device asynchronously (or GPUDirect Storage reads
//                     straight into device memory, see gpu.h)
//   the caller's own  a callback returns memory the caller already holds
//                     (vLLM's allocated parameters), of any of the kinds above
//
// Putting bytes into a region is part of the seam (write_region,
// read_region, PendingCopies below): the engine's runners and the GPU path's
// own reads use the same functions, whatever the memory.
//
// Lifetimes: a Region's `owner` keeps its memory alive (null when the caller
// owns it); the TensorView the engine delivers carries that owner.
// Threading: allocate() and the Uploader are called from the engine's I/O
// threads, concurrently; implementations are thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "weightlift/device.h"
#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/read_path.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

// What the engine asks memory for: one tensor (this rank's part of it).
struct TensorRequest : TensorMeta {  // shape, nbytes: of the bytes to write (the shard's)
  uint64_t ordinal = 0;              // position in checkpoint order
};

// One tensor's memory: exactly `size` bytes at `data` on `device`.
struct Region {
  std::byte* data = nullptr;
  uint64_t size = 0;
  Device device;
  std::shared_ptr<const void> owner;  // keeps `data` alive; null when the caller owns it
};

// A slot of pinned staging memory from an Uploader's ring.
struct StagingSlot {
  std::span<std::byte> bytes;  // host-writable, pinned, aligned to 4096
  uint32_t id = 0;             // the Uploader's own index
};

// One copy out of a slot: bytes [src_offset, src_offset+size) of the slot
// into dst (device memory).
struct UploadCopy {
  uint64_t src_offset = 0;
  std::byte* dst = nullptr;
  uint64_t size = 0;
};

// One copy out of host memory registered with Uploader::register_host():
// bytes [src, src+size) into dst (device memory).
struct HostCopy {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  uint64_t size = 0;
};

// Copies without the staging copy, out of host memory the caller keeps
// mapped and unchanged (a hot file's page cache, mapped read-only): the
// memory is registered for DMA (page-locked, read-only) and copied from in
// place. A capability of some uploaders (Uploader::host_registration());
// register_host may still be refused (kUnimplemented), and the caller then
// stages through the slots instead. Thread-safe.
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
  // Registers [p, p+n) (p page-aligned; n rounded up to pages). Ranges
  // registered must not overlap.
  virtual Status register_host(const std::byte* p, uint64_t n) = 0;
  // Undoes register_host(p), once no copy out of it is in flight.
  virtual void unregister_host(const std::byte* p) = 0;
  // Queues copies out of registered host memory; `done` runs once they
  // completed (as Uploader::submit()). On an error return `done` is not called.
  virtual Status submit_host(std::span<const HostCopy> copies, std::function<void(Status)> done) = 0;
};

// GPUDirect Storage (gpu.h): reads from a file straight into device memory.
// A capability of some uploaders (Uploader::direct_reads()). Thread-safe.
class DirectReads {
 public:
  virtual ~DirectReads() = default;
  // The destination's wish for it (its option), which choose() weighs.
  virtual Toggle wish() const = 0;
  // Whether read() can read `probe` (the load's first file, opened with
  // O_DIRECT): OK, or the reason it cannot.
  virtual Status support(const RandomAccessFile& probe) = 0;
  // The load's decision, before its first tensor is handed over: read()
  // serves its reads (`on`), or they are staged through the ring (`why`).
  virtual void chosen(bool on, const std::string& why) = 0;
  // n bytes of `file` at file_offset straight into device memory at dst;
  // only after chosen(true). An error fails the load (there is no fallback
  // once tensors were handed over).
  virtual Status read(const RandomAccessFile& file, uint64_t file_offset, std::byte* dst, uint64_t n) = 0;
};

// Moves bytes from pinned staging memory into device memory asynchronously:
// a ring of a few slots allocated once per process and reused (never sized by
// the largest tensor), copies on two or more streams, an event per slot that
// returns it to the ring when its copies have completed. An Uploader serves
// one load (its cancel() ends that load only); the ring behind it outlives it.
// Capabilities beyond the ring come as interfaces of their own
// (host_registration(), direct_reads()): null where an uploader lacks them.
class Uploader {
 public:
  virtual ~Uploader() = default;
  // OK when the ring can be had (made now if it was not yet); else why not.
  virtual Status ready() { return Status(); }
  // Bytes per slot; the engine cuts its reads to fit.
  virtual uint64_t slot_bytes() const = 0;
  // Slots in the ring (0: unknown); the engine sizes its readers by it.
  virtual uint32_t slot_count() const = 0;
  // A free slot, waiting while all are in flight. kCancelled after cancel().
  virtual Result<StagingSlot> acquire() = 0;
  // Queues the copies; the slot goes back to the ring once they complete, and
  // `done` runs then (on an uploader thread) with the copies' status. On an
  // error return, `done` is not called and the slot is released.
  virtual Status submit(StagingSlot slot, std::span<const UploadCopy> copies, std::function<void(Status)> done) = 0;
  // Returns a slot unused (a read into it failed).
  virtual void release(StagingSlot slot) = 0;
  // Waits until every submitted copy has completed and its `done` has
  // returned; the first copy error.
  virtual Status flush() = 0;
  // Wakes every acquire() with kCancelled; in-flight copies still complete.
  virtual void cancel() = 0;

  // Copies straight out of registered host memory; null when this uploader
  // and its device cannot.
  virtual HostRegistration* host_registration() { return nullptr; }
  // GPUDirect Storage; null for an uploader without direct reads.
  virtual DirectReads* direct_reads() { return nullptr; }
};

class Destination {
 public:
  virtual ~Destination() = default;
  virtual Device device() const = 0;
  // Before the first allocate(): every tensor the load will allocate, in
  // checkpoint order, so that a destination can take one allocation per load
  // (tensors are then views with a shared owner). Optional.
  virtual Status reserve(std::span<const TensorRequest> tensors) {
    (void)tensors;
    return Status();
  }
  // Memory for one tensor, exactly request.nbytes. Thread-safe.
  virtual Result<Region> allocate(const TensorRequest& request) = 0;
  // nullptr when the memory is host-accessible (the engine reads into it);
  // the copy engine for device memory.
  virtual Uploader* uploader() { return nullptr; }
};

// Pageable host memory: one buffer per tensor (Tensor::empty: huge-page
// backed when large), or, after reserve(), one arena per load.
std::unique_ptr<Destination> host_destination();
// The caller's memory: `fn` returns a region of exactly request.nbytes on
// `device` (kCuda regions need `uploader`, e.g. gpu::uploader()). With
// WEIGHTLIFT_CALLER_HUGE_PAGES=1, host regions are advised for transparent
// huge pages (their 2 MiB-aligned interior, MADV_HUGEPAGE) before the engine
// writes them (off by default: see destination.cpp).
using RegionFn = std::function<Result<Region>(const TensorRequest&)>;
std::unique_ptr<Destination> caller_destination(RegionFn fn, Device device = kCpu, Uploader* uploader = nullptr);

// First touch of the caller's host memory moved ahead of the load that will
// fill it: while the caller allocates that memory (vLLM builds the model,
// allocating every parameter and touching none), each range given to add()
// is faulted in on a background thread (MADV_POPULATE_WRITE: the pages
// mapped writable, their contents unchanged; with huge_pages, the range's
// 2 MiB-aligned interior advised for transparent huge pages first), so that
// the load's copies find the pages there instead of faulting each one in.
// Never changes a byte: a range freed or reused meanwhile is harmless (the
// kernel refuses unmapped ranges; mapped ones are only faulted in). Where
// the kernel has no MADV_POPULATE_WRITE (Linux < 5.14) it does nothing.
// Thread-safe; stop() (and the destructor) ends it between ranges.
class Prefaulter {
 public:
  explicit Prefaulter(bool huge_pages);
  ~Prefaulter();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;
  void add(std::byte* data, uint64_t size);
  // Stops (the range in progress completes) and joins.
  void stop();
  uint64_t bytes_queued() const;
  uint64_t bytes_done() const;

 private:
  struct State;
  std::shared_ptr<State> s_;
};

// ---- putting bytes into regions ------------------------------------------------------

// Counts asynchronous copies still in flight; the first error wins. (An
// Uploader counts one load's submissions in one, src/gpu/ring.h.)
// Thread-safe.
class PendingCopies {
 public:
  void add(int n = 1);
  void done(const Status& s);
  // Waits until none is in flight; the first error.
  Status wait();
  // Waits, then forgets the error.
  void reset();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
  Status first_;
};

// Host bytes to put at `dst_offset` inside a region.
struct HostPiece {
  const std::byte* src = nullptr;
  uint64_t dst_offset = 0, size = 0;
};

// Writes host bytes into a region: memcpy for host memory; for device memory
// through the destination's Uploader, packed into its slots (a piece may span
// slots, a slot may carry many pieces), waiting for every copy. A piece
// outside the region is kInternal.
Status write_region(Destination& dest, const Region& r, std::span<const HostPiece> pieces);
Status write_region(Destination& dest, const Region& r, uint64_t offset, std::span<const std::byte> src);
// Reads n bytes of `file` at file_offset into a region at `offset`: straight
// into host memory; through the Uploader's slots for device memory, the
// copies counted in `pending` (wait on it before handing the region over).
Status read_region(Destination& dest, const Region& r, uint64_t offset, const RandomAccessFile& file,
                   uint64_t file_offset, uint64_t n, PendingCopies& pending);

}  // namespace wl
