// weightlift/read_path.h: how a load reads, decided in one place.
//
// choose() turns a request (where the bytes come from, where they land, what
// the caller wishes, the A/B switches its options carry) and the facts it
// asks for (page-cache residency, the filesystem, the memory, the cores, the
// destination's uploader, GPUDirect Storage) into a ReadPath: the strategy
// that runs, O_DIRECT, file views, GDS, checkpoint order, and every size the
// runners use: the stream's threads, read size, memory window and staging,
// where device copies read from, a distributed load's exchange block and its
// memory split, the workers of the per-file strategies and the prefetcher.
// plan_load() (load_plan.h) asks it, once per load, and the runners only
// carry the path out; docs/engine.md lists the rules, tests/read_path_test.cpp
// checks each.
//
// Facts are asked lazily (only when a rule needs one) and at most once each,
// so a dry run that knows less (Python's patchable filesystem helpers) gets
// the same answer the engine gets with more facts.
// Threading: choose() is a pure function of its arguments; a ReadFacts object
// is used from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/device.h"
#include "weightlift/io.h"
#include "weightlift/prefetch.h"
#include "weightlift/status.h"
#include "weightlift/system.h"

namespace wl {

// The engine's strategies. strategy_names() is the one vocabulary: the CLI,
// the Python options, the vLLM plug-in and weight_utils take it from here.
enum class Strategy { kLazy, kEager, kPrefetch, kAuto, kThreads, kStream };

// "lazy", "eager", "prefetch", "auto", "threads", "stream"; nullopt when unknown.
std::optional<Strategy> strategy_from_name(std::string_view name);
std::string_view strategy_name(Strategy s);
// Every strategy's name, in the enum's order.
const std::vector<std::string>& strategy_names();

// A wish about one way of reading: kAuto leaves it to choose().
// LoadOptions::direct (O_DIRECT) and gpu::CudaOptions::gds (GPUDirect Storage).
enum class Toggle { kAuto, kOn, kOff };
// "auto", "on", "off"; nullopt otherwise.
std::optional<Toggle> toggle_from_name(std::string_view name);
std::string_view toggle_name(Toggle t);

// Where the bytes come from.
enum class SourceKind {
  kLocal,     // files on a local or network filesystem
  kArriving,  // files a source is still writing (Env::arriving(): the Hub's load while downloading)
  kRemote,    // URLs: http(s), s3, gs (every read is a request)
};

// Where the bytes land.
enum class DestKind {
  kHost,    // host memory of the engine's choosing (no destination given)
  kPinned,  // page-locked host memory (gpu::pinned_destination)
  kCaller,  // the caller's own host memory (caller_destination)
  kDevice,  // device memory (a CUDA destination, or the caller's device memory)
};

// Where a stream's copies into device memory read from.
enum class CopySource {
  kSlots,   // every chunk read into a slot of the uploader's pinned ring first
  kMapped,  // straight out of the file's page cache, registered read-only for DMA
};
std::string_view copy_source_name(CopySource s);  // "slots", "mapped"

struct ReadRequest {
  SourceKind source = SourceKind::kLocal;
  std::string first_file;  // names the source in reasons and errors; "" = no files
  size_t files = 0;        // how many files (0 with first_file set: at least one)
  DestKind dest = DestKind::kHost;
  Device device = kCpu;             // the destination's device (kDevice: which one)
  bool distributed = false;         // ranks read once in total and exchange (collective.h)
  int world = 1;                    // distributed: the ranks
  Device collective_device = kCpu;  // distributed: the memory the collective exchanges in
  // The caller's wishes.
  Strategy strategy = Strategy::kAuto;
  Toggle direct = Toggle::kAuto;  // O_DIRECT
  Toggle gds = Toggle::kOff;      // GPUDirect Storage (the destination's option)
  bool file_views = false;        // LoadOptions::file_views
  bool populate_views = true;     // LoadOptions::populate_views
  uint64_t max_memory = 0;        // LoadOptions::max_memory
  int threads = 0;                // LoadOptions::threads (0: each strategy's default)
  uint64_t block_size = 0;        // LoadOptions::block_size (0: each strategy's default)
  // The A/B switches (switches.h, carried by LoadOptions::switches).
  // WEIGHTLIFT_DEVICE_STRATEGY=asked: a per-file strategy into device memory
  // runs as asked, not as the stream.
  bool device_as_asked = false;
  // WEIGHTLIFT_H2D_SOURCE: "auto", "slot" or "mapped" (anything else is
  // refused, naming the variable, where a rule needs it).
  std::string h2d_source = "auto";
  // The plan is a read-ahead's (read_ahead.h): size it too (ReadPath::read_ahead).
  bool read_ahead = false;
};

// What a destination's uploader offers (destination.h), as choose() weighs it.
struct UploaderFacts {
  bool present = false;            // the destination has one (memory the host cannot address)
  Status ready;                    // its ring can be had (else why not)
  uint64_t slot_bytes = 0;         // bytes per ring slot
  uint32_t slot_count = 0;         // slots in the ring (0: unknown)
  bool host_registration = false;  // it copies straight out of registered host memory
};

// How one stream reads: the stream strategy, a distributed load's own part
// and its reads of the shared stream.
struct StreamSetup {
  int threads = 0;                              // I/O threads
  uint64_t read_size = 0;                       // bytes a thread claims and reads at once (a chunk)
  uint64_t window = 0;                          // bytes of tensors allocated and not yet handed over (0: no limit)
  uint64_t max_memory = 0;                      // the cap the sizes fit (0: none)
  uint64_t staging = 0;                         // O_DIRECT into host memory: per-thread aligned buffers, in all
  bool direct = false;                          // O_DIRECT
  bool gds = false;                             // GPUDirect Storage into device memory
  bool remote = false;                          // URLs: ranged GETs
  Device device = kCpu;                         // where the bytes land
  CopySource copy_source = CopySource::kSlots;  // device memory without GDS
  uint32_t slots = 0;                           // device memory: the ring's slots
  uint64_t slot_bytes = 0;                      //   and their size
  // "stream: 8 threads, 8192 KiB reads, O_DIRECT, to cpu, memory cap none" (the log's line).
  std::string describe() const;
};
// `s` for a stream of `bytes` (0: not known): never more threads than chunks.
StreamSetup fit_stream(StreamSetup s, uint64_t bytes);

struct ReadPath {
  Strategy strategy = Strategy::kLazy;  // never kAuto
  bool direct = false;                  // the stream strategy reads with O_DIRECT
  bool file_views = false;              // whole tensors are views of private file mappings
  bool populate_views = true;           // file_views: their pages read and mapped in as they are handed over
  bool gds = false;                     // the stream strategy reads into device memory with cuFile
  std::string gds_off;                  // why not, when it was considered ("gds=off", cuFile's refusal)
  uint64_t max_memory = 0;              // the stream's memory cap (0: none)
  bool ordered = false;                 // tensors handed over in checkpoint order (LoadOptions::ordered)
  // The sizes, for the strategy that runs:
  StreamSetup stream;           // kStream: the stream (distributed: this rank's own tensors, under half the cap)
  int workers = 0;              // kThreads: files loaded at once
  int prefetch_threads = 0;     // kPrefetch: the page-cache prefetcher's threads
  uint64_t prefetch_block = 0;  //   and its block size
  // Distributed: this rank's reads of its slices of the shared stream (into
  // host exchange memory; fit_stream() to each slice), the bytes each rank
  // contributes per round (this rank's wish: every rank takes the smallest
  // wish of them all), and the threads that copy received bytes into tensors.
  // exchange_arena: this rank can receive straight into one buffer of the
  // engine's (host memory of the engine's choosing, a host collective); the
  // load uses one when every rank can.
  StreamSetup exchange_reads;
  uint64_t exchange_block = 0;
  bool exchange_arena = false;
  int scatter_threads = 0;
  // A read-ahead of the load (read_ahead.h, asked with ReadRequest::read_ahead):
  // its threads, block size and memory bound (local files: bytes brought into
  // the page cache; remote ones: bytes staged and not yet consumed).
  struct ReadAheadSetup {
    bool remote = false;
    int threads = 0;
    uint64_t block = 0;
    uint64_t max_memory = 0;
  };
  ReadAheadSetup read_ahead;
  // Lines for the log, in the order the rules fired; `warn` when one is a
  // warning (a prefetch that may not fit in memory).
  std::vector<std::string> log;
  bool warn = false;
  // The prefetch rule's verdict and facts, when it was consulted.
  std::optional<AutoDecision> prefetch;
};

// What choose() may consult. Each method is called at most once per choose().
class ReadFacts {
 public:
  virtual ~ReadFacts() = default;
  // Fraction (0..1) of a sample of the files' pages in the page cache;
  // nullopt when it cannot be told (remote files, files still arriving).
  // An error: a file that cannot be opened.
  virtual Result<std::optional<double>> cached_fraction() = 0;
  // The filesystem type of the first file ("nfs", "ext4"; "" when unknown).
  virtual std::string fs_type() = 0;
  virtual Result<uint64_t> checkpoint_bytes() = 0;
  virtual Result<uint64_t> available_memory() = 0;
  // Whether every tensor to read lies whole and contiguous in its file (a
  // file view can serve each); nullopt before the files were planned.
  virtual std::optional<bool> contiguous() = 0;
  // Whether GPUDirect Storage can read the first file into the destination's
  // memory (false: `why` says why). An error: the file cannot be opened.
  virtual Result<bool> gds_usable(std::string* why) = 0;
  // CPU cores of this machine (default: std::thread::hardware_concurrency()).
  virtual unsigned cores();
  // The destination's uploader (present: false for memory the host
  // addresses); nullopt when not known (default).
  virtual std::optional<UploaderFacts> uploader() { return std::nullopt; }
  // Bytes the stream would read (the planned tensors stored contiguously); 0
  // when not known.
  virtual uint64_t stream_bytes() { return 0; }
};

// The facts of these files, asked of `env` and `system`: residency sampled
// from the first 8 files; contiguity unknown; no GPUDirect Storage.
std::unique_ptr<ReadFacts> file_facts(const std::vector<std::string>& files, Env* env = Env::Default(),
                                      SystemInfo* system = SystemInfo::Default());

// Facts the caller already holds (a table in a test; Python's patchable
// filesystem helpers). Each one not given is asked of `rest`, or unknown
// when `rest` is null (no residency, filesystem "", sizes kUnavailable, no GDS).
class GivenFacts final : public ReadFacts {
 public:
  explicit GivenFacts(ReadFacts* rest = nullptr) : rest_(rest) {}
  std::optional<std::optional<double>> cached;  // {nullopt}: residency given as unknown
  std::optional<std::string> fstype;
  std::optional<uint64_t> bytes, available;
  std::optional<bool> whole;
  std::optional<std::string> gds_refusal;  // "" = GDS usable; else why not

  Result<std::optional<double>> cached_fraction() override;
  std::string fs_type() override;
  Result<uint64_t> checkpoint_bytes() override;
  Result<uint64_t> available_memory() override;
  std::optional<bool> contiguous() override;
  Result<bool> gds_usable(std::string* why) override;
  unsigned cores() override;
  std::optional<UploaderFacts> uploader() override;
  uint64_t stream_bytes() override;

 private:
  ReadFacts* rest_;
};

// The read path of `request`. The rules, in order:
//   distributed       always the stream strategy (the wish is ignored)
//   auto              a device destination: stream; files still arriving:
//                     lazy with file views into host memory of the engine's
//                     choosing, else stream; the caller's memory: stream;
//                     URLs: stream; otherwise the
//                     prefetch rule (decide_prefetch: prefetch on a network
//                     filesystem when the checkpoint fits in 90% of the
//                     available RAM, else lazy; lazy when a fact is missing)
//   device            lazy / eager / threads / prefetch into device memory:
//                     the stream strategy instead (it overlaps reads with
//                     copies; the others stage one tensor at a time through
//                     the pinned ring), lazy / eager / prefetch keeping their
//                     file order (ordered); as asked with device_as_asked
//   prefetch          the prefetch rule's facts and warning (local files)
//   file views        only into host memory of the engine's choosing, never
//                     for the stream strategy
//   cold views        file views wished for lazy / eager / threads, direct
//                     not off, every tensor contiguous, under half of the
//                     sampled pages cached: the stream strategy instead
//                     (direct auto, memory capped at 256 MiB unless capped)
//   direct (stream)   never for URLs; on / off as wished; auto: O_DIRECT when
//                     under half of the sampled pages are cached
//   GDS (stream into device memory)  off as wished; else when the first file
//                     can be read with cuFile; wished on but unusable:
//                     kUnimplemented naming the file, before any read
//   copy source       device memory without GDS or O_DIRECT, not a URL:
//                     WEIGHTLIFT_H2D_SOURCE slot / mapped as set (mapped only
//                     where the uploader registers host memory); auto: mapped
//                     on a machine with under 8 cores when at least 90% of
//                     the sampled pages are cached
//   stream sizes      threads: as asked, else 8 for O_DIRECT (reads in
//                     flight), 16 for URLs (requests), one per core (2..8)
//                     for buffered copies, one per core up to half the ring's
//                     slots into device memory; reads of block_size (8 MiB),
//                     within a device ring's slot; a memory cap splits into
//                     staging (O_DIRECT into host memory: threads x read
//                     size, in half the cap) and the window of allocated
//                     tensors; a distributed load's own part gets half the
//                     cap, and each round's block is 4 reads, at most a
//                     quarter of the cap shared by the ranks
//   per-file sizes    threads: as asked, else 8 workers (at most one per
//                     file); prefetch: threads and block size as asked, else
//                     8 threads of 16 MiB blocks
//   read-ahead        (read_ahead requests) threads as asked, else 4 paging
//                     local files in, 16 connections staging remote ones;
//                     blocks as asked, else 8 MiB; bounded by max_memory, else
//                     half the available RAM (page cache) or a quarter
//                     (staging)
// Errors: a fact that cannot be found out where a rule needs it (a file that
// cannot be opened), GDS required but unusable, a device destination without
// an uploader (or its ring), a bad WEIGHTLIFT_H2D_SOURCE where it is weighed.
Result<ReadPath> choose(const ReadRequest& request, ReadFacts& facts);

}  // namespace wl
