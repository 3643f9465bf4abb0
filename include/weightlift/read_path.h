// weightlift/read_path.h: which read path a load takes, decided in one place.
//
// choose() turns a request (where the bytes come from, where they land, what
// the caller wishes) and the facts it consults (page-cache residency, the
// filesystem, the memory, GPUDirect Storage) into a ReadPath: the strategy
// that runs, whether the stream reads with O_DIRECT, whether tensors are
// views of private file mappings, whether GPUDirect Storage reads into
// device memory. Every caller asks it: load_files() (and through it the
// distributed loader), the CLI, the Python package; docs/engine.md lists the
// rules, tests/read_path_test.cpp checks each.
//
// Facts are asked lazily (only when a rule needs one) and at most once each,
// so a caller that knows less (the CLI before planning, Python with its own
// filesystem helpers) asks the same function and gets the same answer the
// engine gets later with more facts.
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

enum class Strategy { kLazy, kEager, kPrefetch, kAuto, kThreads, kStream };

// "lazy", "eager", "prefetch", "auto", "threads", "stream"; nullopt when unknown.
std::optional<Strategy> strategy_from_name(std::string_view name);
std::string_view strategy_name(Strategy s);

// A wish about one way of reading: kAuto leaves it to choose().
// LoadOptions::direct (O_DIRECT) and gpu::CudaOptions::gds (GPUDirect Storage).
enum class Toggle { kAuto, kOn, kOff };
// "auto", "on", "off"; nullopt otherwise.
std::optional<Toggle> toggle_from_name(std::string_view name);
std::string_view toggle_name(Toggle t);

// Where the bytes come from.
enum class SourceKind {
  kLocal,     // files on a local or network filesystem
  kArriving,  // files still downloading (the Hub's load while downloading, hub.h)
  kRemote,    // URLs: http(s), s3, gs (every read is a request)
};

// Where the bytes land.
enum class DestKind {
  kHost,    // host memory of the engine's choosing (no destination given)
  kPinned,  // page-locked host memory (gpu::pinned_destination)
  kCaller,  // the caller's own host memory (caller_destination)
  kDevice,  // device memory (a CUDA destination, or the caller's device memory)
};

struct ReadRequest {
  SourceKind source = SourceKind::kLocal;
  std::string first_file;  // names the source in reasons and errors; "" = no files
  DestKind dest = DestKind::kHost;
  Device device = kCpu;      // the destination's device (kDevice: which one)
  bool distributed = false;  // ranks read once in total and exchange (collective.h)
  // The caller's wishes.
  Strategy strategy = Strategy::kAuto;
  Toggle direct = Toggle::kAuto;  // O_DIRECT
  Toggle gds = Toggle::kOff;      // GPUDirect Storage (the destination's option)
  bool file_views = false;        // LoadOptions::file_views
  uint64_t max_memory = 0;        // LoadOptions::max_memory
  // A per-file strategy into device memory runs as asked, not as the stream
  // (WEIGHTLIFT_DEVICE_STRATEGY=asked, for A/B runs; read_request() reads it).
  bool device_as_asked = false;
};

struct ReadPath {
  Strategy strategy = Strategy::kLazy;  // never kAuto
  bool direct = false;                  // the stream strategy reads with O_DIRECT
  bool file_views = false;              // whole tensors are views of private file mappings
  bool gds = false;                     // the stream strategy reads into device memory with cuFile
  std::string gds_off;                  // why not, when it was considered ("gds=off", cuFile's refusal)
  uint64_t max_memory = 0;              // the stream's memory cap (0: none)
  bool ordered = false;                 // tensors handed over in checkpoint order (LoadOptions::ordered)
  // Lines for LoadOptions::log, in the order the rules fired; `warn` when one
  // is a warning (a prefetch that may not fit in memory).
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
// Errors: a fact that cannot be found out where a rule needs it (a file that
// cannot be opened), GDS required but unusable.
Result<ReadPath> choose(const ReadRequest& request, ReadFacts& facts);

}  // namespace wl
