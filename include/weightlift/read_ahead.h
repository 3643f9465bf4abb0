// weightlift/read_ahead.h: a load's reads started before the load ("plan
// now, execute later"). While the caller builds the memory the tensors will
// land in (vLLM constructs its model, allocating every parameter), a
// background job reads the bytes the later load_files() of the same files
// will need, so that the load itself reads from memory:
//
//   local files     into the page cache (the file mapped and its pages
//                   faulted in block by block, then unmapped: no copy, no
//                   memory of this process); the load then reads them at
//                   memory speed (buffered, since they are cached)
//   remote sources  (s3://, gs://, http(s)://) into staging memory that the
//                   load consumes through env(): a load given that Env reads
//                   staged bytes from memory (waiting for a block still in
//                   flight instead of asking the server twice) and the rest
//                   from the source; each staged block is freed once every
//                   byte of it was read. Once the load reaches a block the
//                   job has not, the job takes no further block (the load's
//                   own connections read the rest: the source never sees
//                   both at once: docs/vllm.md measures what that cost)
//
// Which bytes: every tensor that load_files() would plan for the same files
// with the same `select` and `local_experts` (the expert filter: other
// ranks' experts are never read), in the load's stream order (files as
// given, each file's tensors by offset). With world_size > 1, this rank's
// 1/world_size of those bytes (a contiguous slice of that order): the ranks
// of one host then warm the shared page cache once in total. Local files,
// nothing left to the load by the bound: once its slice is read, the job
// helps with the other ranks' slices (the next rank's first), skipping the
// blocks the page cache already holds, so that the host's read ends when
// the disk is done rather than when its slowest rank is (the page cache
// reads a page once however many ranks ask for it).
//
// Order: with `first`, two passes: the tensors it picks (in stream order),
// then the others; each pass split among the ranks as above, the memory
// bound admitting the first pass first. A caller that needs some tensors
// sooner than others (the copies before the file views) names them there.
// Local files: the threads take runs of a few consecutive blocks in that
// order, each run read front to back by one thread.
//
// Bounds: local files, at most `max_memory` bytes brought into the page
// cache (0: half of the available RAM; the rest is read by the load as
// before); remote sources, at most `max_memory` bytes staged and not yet
// consumed at once (0: a quarter of the available RAM), the job waiting for
// the load to consume blocks before it stages more.
//
// Failures never fail the later load: a file the job cannot open or read is
// left to the load, which reads it from the source and reports its own
// error; status() says what the job met.
// Threading: start() returns at once (planning runs on the job's thread);
// every method may be called from any thread; env() is thread-safe and
// must not outlive the ReadAhead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/system.h"

namespace wl {

struct ReadAheadOptions {
  Env* env = Env::Default();
  SystemInfo* system = SystemInfo::Default();
  int threads = 0;          // 0: 4 for local files, 16 connections for remote sources
  uint64_t block_size = 0;  // bytes per read; 0: 8 MiB
  uint64_t max_memory = 0;  // see "Bounds" above
  int rank = 0, world_size = 1;
  std::optional<std::set<int64_t>> local_experts;     // as LoadOptions::local_experts
  std::function<bool(std::string_view name)> select;  // as LoadOptions::select
  std::function<bool(std::string_view name)> first;   // see "Order" above (unset: one pass)
};

struct ReadAheadProgress {
  uint64_t bytes_planned = 0;   // this rank's share of the tensors' bytes (0 until planned)
  uint64_t bytes_cached = 0;    // of them, local bytes already in the page cache when the job reached them
  uint64_t bytes_read = 0;      // read by the job so far (page cache filled, or staged)
  uint64_t bytes_capped = 0;    // left to the load by the memory bound
  uint64_t bytes_consumed = 0;  // remote: staged bytes the load has taken through env()
  uint64_t bytes_helped = 0;    // local, world_size > 1: bytes of other ranks' slices this job read
  bool overtaken = false;       // remote: the load reached a block the job had not; the job stopped there
  uint64_t overtaken_at = 0;    // bytes_read then
  bool planned = false, done = false;
  bool remote = false;
  double seconds = 0;  // from start() to done (or to now)
};

class ReadAhead {
 public:
  // Starts the job; kInvalidArgument for bad options (no files, threads < 0,
  // a rank outside [0, world_size), a block size over 1 GiB).
  static Result<std::unique_ptr<ReadAhead>> start(std::vector<std::string> files, ReadAheadOptions options);
  // Stops the job (between blocks), joins it and frees what is staged.
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  ReadAheadProgress progress() const;
  // Waits until the job has planned (its sizes known: planned, bytes_planned,
  // bytes_capped) or has ended, and returns the progress then. Planning
  // reads the files' headers only; a load that asks what the job will cover
  // (a model built faster than the headers are read) waits here.
  ReadAheadProgress wait_planned() const;
  // Waits until the job has ended; what it met (OK, or the first failure:
  // the load reads those bytes itself).
  Status wait();
  // Stops reading ahead (blocks already staged stay served); returns at once.
  void stop();
  // The Env a load passes as LoadOptions::env: staged bytes from memory,
  // everything else forwarded to options.env. For local files it forwards
  // everything (the page cache serves them).
  Env* env();

  struct State;

 private:
  explicit ReadAhead(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::shared_ptr<State> s_;
};

// The end of a read-ahead for memory that maps files (the vLLM plug-in's
// parameters made views of the checkpoint's pages): every page of `ranges`
// brought into memory (read from the file where the page cache does not
// hold it) and mapped into this process (MADV_POPULATE_READ: read faults
// only, so a private mapping stays shared with the page cache and no page
// is copied), `threads` threads at a time (0: 4), each paging in runs of a
// range's consecutive 8 MiB chunks front to back, so that a load that
// returns leaves no read to the first access. Each range must lie in a
// mapping of this process. kIoError naming the range's index when its
// pages cannot be read: the file was truncated under the mapping (a later
// access would raise SIGBUS), or the read failed. Kernels before 5.14
// (no MADV_POPULATE_READ): one read per page instead, which a truncated
// file turns into SIGBUS.
struct MappedRange {
  const std::byte* data = nullptr;
  uint64_t size = 0;
};
struct PopulateStats {
  uint64_t bytes = 0;               // the ranges' bytes
  uint64_t bytes_not_resident = 0;  // of them, on pages the page cache did not hold at the call (mincore)
  double seconds = 0;
};
Result<PopulateStats> populate_read(std::span<const MappedRange> ranges, int threads = 0);

}  // namespace wl
