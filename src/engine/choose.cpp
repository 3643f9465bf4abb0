// choose(): the one place that decides how a load reads (read_path.h lists
// the rules; tests/read_path_test.cpp has a row for each).
#include <algorithm>

#include <fmt/format.h>

#include "weightlift/read_path.h"

namespace wl {

namespace {

constexpr uint64_t kAlign = 4096;
// The stream's read size when the caller gives none.
constexpr uint64_t kDefaultReadSize = uint64_t{8} << 20;
// The stream's threads: O_DIRECT reads in flight; requests to a remote source.
constexpr int kDirectThreads = 8;
constexpr int kRemoteThreads = 16;
// A distributed round's block: this many stream reads.
constexpr uint64_t kReadsPerBlock = 4;
// A stream's copies into device memory read straight out of the page cache
// on machines with fewer cores than this (the readers' copies into the slots
// cannot keep up with a PCIe link there), when the checkpoint is this hot.
constexpr unsigned kMappedBelowCores = 8;
constexpr double kMappedResidency = 0.9;
// File views out of cold files: the stream strategy's memory cap when the caller set none.
constexpr uint64_t kColdViewsMemory = uint64_t{256} << 20;

// Asks each fact at most once (residency, memory and the uploader are consulted by several rules).
class Asked {
 public:
  explicit Asked(ReadFacts& f) : facts(f) {}
  Result<std::optional<double>> cached_fraction() {
    if (!cached_) cached_ = facts.cached_fraction();
    return *cached_;
  }
  Result<uint64_t> available_memory() {
    if (!available_) available_ = facts.available_memory();
    return *available_;
  }
  const std::optional<UploaderFacts>& uploader() {
    if (!uploader_asked_) uploader_ = facts.uploader(), uploader_asked_ = true;
    return uploader_;
  }
  unsigned cores() {
    if (!cores_) cores_ = std::max(1u, facts.cores());
    return *cores_;
  }
  ReadFacts& facts;

 private:
  std::optional<Result<std::optional<double>>> cached_;
  std::optional<Result<uint64_t>> available_;
  std::optional<UploaderFacts> uploader_;
  bool uploader_asked_ = false;
  std::optional<unsigned> cores_;
};

// The prefetch rule over the facts; nullopt (and the reason in `missing`) when a fact is missing.
std::optional<AutoDecision> prefetch_rule(Asked& facts, bool requested, std::string* missing) {
  std::string fstype = facts.facts.fs_type();
  auto bytes = facts.facts.checkpoint_bytes();
  if (!bytes.ok()) return *missing = bytes.status().to_string(), std::nullopt;
  auto avail = facts.available_memory();
  if (!avail.ok()) return *missing = avail.status().to_string(), std::nullopt;
  return decide_prefetch(std::move(fstype), *bytes, *avail, requested);
}

// `auto`: which strategy runs.
void resolve_auto(const ReadRequest& r, Asked& facts, ReadPath& p) {
  if (r.dest == DestKind::kDevice) {
    p.strategy = Strategy::kStream;
    p.log.push_back("auto: stream (a " + r.device.to_string() + " destination)");
  } else if (r.source == SourceKind::kArriving) {
    // Each tensor a view of the cache's partial file once its bytes arrived
    // (no second copy); into a destination, parallel readers.
    p.strategy = r.dest == DestKind::kHost ? Strategy::kLazy : Strategy::kStream;
    p.file_views = r.dest == DestKind::kHost;
    p.log.push_back(r.dest == DestKind::kHost
                        ? "auto: lazy with file views (files still arriving: each tensor a view of the bytes "
                          "that arrived)"
                        : "auto: stream (files still arriving, into a destination: parallel readers)");
  } else if (r.first_file.empty()) {
    p.strategy = Strategy::kLazy;
    p.log.push_back("auto: no files; lazy");
  } else if (r.dest == DestKind::kCaller) {
    // Memory the caller already holds (parameters, preallocated tensors):
    // parallel reads land straight in it, no mapping to copy out of.
    p.strategy = Strategy::kStream;
    p.log.push_back("auto: stream (the caller's memory: parallel reads straight into it)");
  } else if (r.source == SourceKind::kRemote) {
    p.strategy = Strategy::kStream;
    p.log.push_back(fmt::format("auto: stream ({}:// is a remote source: parallel ranged reads into the tensors)",
                                url_scheme(r.first_file)));
  } else {
    std::string missing;
    p.prefetch = prefetch_rule(facts, /*requested=*/false, &missing);
    p.strategy = p.prefetch && p.prefetch->prefetch ? Strategy::kPrefetch : Strategy::kLazy;
    p.log.push_back(p.prefetch ? p.prefetch->reason : "auto: lazy (" + missing + ")");
    p.warn = p.prefetch && p.prefetch->warn;
  }
}

// A per-file strategy into device memory would stage one tensor at a time
// through the pinned ring (no read overlaps a copy); the stream overlaps them
// across its threads. The file order of lazy / eager / prefetch is kept.
void device_streams(const ReadRequest& r, ReadPath& p) {
  p.log.push_back(
      fmt::format("{}: the stream strategy instead (a {} destination: {} would stage one tensor at a time "
                  "through the pinned ring; WEIGHTLIFT_DEVICE_STRATEGY=asked runs it as asked)",
                  strategy_name(r.strategy), r.device.to_string(), strategy_name(r.strategy)));
  p.strategy = Strategy::kStream;
  p.ordered = r.strategy != Strategy::kThreads;
}

// File views wished, but the files are mostly not in the page cache: N
// threads of O_DIRECT reads into memory (the stream strategy) beat filling
// the cache by faults at one readahead stream's pace. direct off (never
// bypass the page cache, e.g. while a prefetch fills it) keeps the views.
bool views_from_cold_files(const ReadRequest& r, Asked& facts, const ReadPath& p) {
  if (!p.file_views || r.direct == Toggle::kOff) return false;
  if (p.strategy != Strategy::kLazy && p.strategy != Strategy::kEager && p.strategy != Strategy::kThreads) return false;
  if (facts.facts.contiguous() != true) return false;
  auto cached = facts.cached_fraction();  // a file that cannot be opened fails later, where it is read
  return cached.ok() && *cached && **cached < 0.5;
}

// The stream strategy's O_DIRECT: never for URLs (a remote source has no
// pages); auto when under half of the sampled pages are cached.
Result<bool> stream_direct(const ReadRequest& r, Toggle wish, Asked& facts) {
  if (r.source == SourceKind::kRemote) return false;
  if (wish != Toggle::kAuto) return wish == Toggle::kOn;
  WL_ASSIGN_OR_RETURN(std::optional<double> cached, facts.cached_fraction());
  return cached && *cached < 0.5;
}

// GPUDirect Storage for a stream into device memory, decided before any read.
Result<bool> stream_gds(const ReadRequest& r, ReadFacts& facts, ReadPath& p) {
  if (r.dest != DestKind::kDevice || r.first_file.empty()) return false;
  std::string why = "gds=off";
  bool use = false;
  if (r.gds != Toggle::kOff) {
    WL_ASSIGN_OR_RETURN(use, facts.gds_usable(&why));
    if (!use && r.gds == Toggle::kOn)
      return Status::Unimplemented("gds=on: GPUDirect Storage cannot be used: " + why).with_file(r.first_file);
  }
  if (!use) p.gds_off = why;
  p.log.push_back(use ? std::string("stream: GPUDirect Storage (cuFile) reads into device memory")
                      : "stream: staging through the pinned ring (GPUDirect Storage off: " + why + ")");
  return use;
}

// Device memory needs an uploader whose ring can be had, with slots large
// enough for aligned reads (the uploader is asked only when it is known).
Status check_uploader(const ReadRequest& r, Asked& facts) {
  if (r.dest != DestKind::kDevice) return Status();
  const std::optional<UploaderFacts>& up = facts.uploader();
  if (!up) return Status();
  if (!up->present)
    return Status::InvalidArgument(fmt::format("a {} destination needs an uploader", r.device.to_string()));
  WL_RETURN_IF_ERROR(up->ready);
  if (up->slot_bytes < 4 * kAlign)
    return Status::InvalidArgument(fmt::format("uploader slots of {} bytes are too small", up->slot_bytes));
  return Status();
}

// Where a stream's copies into device memory read from (without GDS or
// O_DIRECT, not for URLs): the ring's slots, or straight out of the
// registered page cache where the uploader can register host memory.
Result<CopySource> copy_source(const ReadRequest& r, const StreamSetup& s, Asked& facts, ReadPath& p) {
  if (r.dest != DestKind::kDevice || s.gds || s.direct || s.remote) return CopySource::kSlots;
  const std::string& wish = r.h2d_source;
  if (wish != "slot" && wish != "mapped" && wish != "auto")
    return Status::InvalidArgument(fmt::format("WEIGHTLIFT_H2D_SOURCE='{}' (expected slot, mapped or auto)", wish));
  const std::optional<UploaderFacts>& up = facts.uploader();
  if (wish == "slot") return CopySource::kSlots;
  if (!up || !up->host_registration) {
    if (wish == "mapped")
      p.log.push_back(
          "stream: WEIGHTLIFT_H2D_SOURCE=mapped, but this destination cannot register host memory read-only; "
          "staging through the pinned ring");
    return CopySource::kSlots;
  }
  if (wish == "mapped") return CopySource::kMapped;
  if (facts.cores() >= kMappedBelowCores) return CopySource::kSlots;
  auto cached = facts.cached_fraction();  // a file that cannot be opened fails later, where it is read
  return cached.ok() && *cached && **cached >= kMappedResidency ? CopySource::kMapped : CopySource::kSlots;
}

// Threads, read size and the memory split of one stream landing in
// `device` (a device destination stages in its own ring) under `cap`.
// Buffered reads out of a warm page cache are memory copies: more threads
// than cores only contend. O_DIRECT keeps 8 reads in flight. Into device
// memory the readers' copies into the ring's slots are what bounds a hot
// load: one reader per core, as many as half the slots (each holds one while
// reading, the others wait for their copies).
StreamSetup size_stream(const ReadRequest& r, StreamSetup s, uint64_t cap, Asked& facts) {
  const bool device = !s.device.host_accessible();
  if (device)
    if (const std::optional<UploaderFacts>& up = facts.uploader(); up)
      s.slots = up->slot_count, s.slot_bytes = up->slot_bytes;
  s.threads = r.threads > 0 ? r.threads : kDirectThreads;
  s.read_size = r.block_size > 0 ? r.block_size : kDefaultReadSize;
  if (r.threads == 0 && !s.direct) {
    const int cores = static_cast<int>(facts.cores());
    if (s.remote)
      s.threads = kRemoteThreads;
    else if (device && !s.gds && s.slots > 0)
      s.threads = std::clamp(cores, 2, std::clamp(static_cast<int>(s.slots) / 2, 2, 32));
    else
      s.threads = std::clamp(cores, 2, 8);
  }
  s.max_memory = cap;
  if (cap > 0) {
    if (s.direct && !device) {  // staging: an aligned buffer per thread, in half the cap
      uint64_t per = cap / 2 / static_cast<uint64_t>(s.threads);
      while (per < (uint64_t{1} << 20) + 2 * kAlign && s.threads > 1)
        per = cap / 2 / static_cast<uint64_t>(--s.threads);
      s.read_size = std::min(s.read_size, per > 2 * kAlign ? per - 2 * kAlign : kAlign);
      s.read_size = std::max<uint64_t>(s.read_size & ~(kAlign - 1), kAlign);
      s.staging = static_cast<uint64_t>(s.threads) * (s.read_size + 2 * kAlign);
      s.window = cap > s.staging ? cap - s.staging : 1;
    } else {
      s.window = cap;
      s.read_size = std::min<uint64_t>(s.read_size, std::max<uint64_t>(s.window / 2, kAlign));
    }
  } else if (s.direct && !device) {
    s.staging = static_cast<uint64_t>(s.threads) * (s.read_size + 2 * kAlign);
  }
  if (device && s.slot_bytes >= 4 * kAlign)  // a read fits a slot, aligned
    s.read_size = std::min<uint64_t>(s.read_size, (s.slot_bytes - 2 * kAlign) & ~(kAlign - 1));
  return s;
}

// The stream's setup (a distributed load's own part under half the cap, and
// its reads of the shared stream into host memory, and the exchange block).
Status size_the_stream(const ReadRequest& r, Asked& facts, ReadPath& p) {
  WL_RETURN_IF_ERROR(check_uploader(r, facts));
  StreamSetup s;
  s.direct = p.direct;
  s.gds = p.gds;
  s.remote = r.source == SourceKind::kRemote;
  s.device = r.dest == DestKind::kHost ? kCpu : r.device;
  WL_ASSIGN_OR_RETURN(s.copy_source, copy_source(r, s, facts, p));
  uint64_t cap = p.max_memory;
  if (r.distributed && cap > 0) cap = std::max<uint64_t>(cap / 2, 1);
  p.stream = size_stream(r, s, cap, facts);
  if (!r.distributed) {
    p.stream = fit_stream(p.stream, facts.facts.stream_bytes());
    return Status();
  }
  // Distributed: the slices are read into host exchange memory, uncapped;
  // a round's block is kReadsPerBlock reads, two exchange buffers of W
  // blocks in half the cap.
  StreamSetup x;
  x.direct = p.direct;
  x.remote = s.remote;
  const uint64_t read = r.block_size > 0 ? r.block_size : kDefaultReadSize;
  uint64_t block = read * kReadsPerBlock;
  if (r.max_memory > 0)
    block = std::min(block, std::max<uint64_t>(r.max_memory / 4 / static_cast<uint64_t>(std::max(r.world, 1)), kAlign));
  p.exchange_block = std::max<uint64_t>(block & ~(kAlign - 1), kAlign);
  p.exchange_reads = fit_stream(size_stream(r, x, 0, facts), p.exchange_block);
  p.exchange_arena = r.dest == DestKind::kHost && r.collective_device.host_accessible();
  p.scatter_threads = r.threads > 0 ? r.threads : std::clamp(static_cast<int>(facts.cores()), 2, 8);
  return Status();
}

// A read-ahead's sizes (read_ahead.h).
constexpr int kReadAheadLocalThreads = 4;
void size_read_ahead(const ReadRequest& r, Asked& facts, ReadPath& p) {
  ReadPath::ReadAheadSetup& a = p.read_ahead;
  a.remote = r.source == SourceKind::kRemote;
  a.threads = r.threads > 0 ? r.threads : a.remote ? kRemoteThreads : kReadAheadLocalThreads;
  a.block = r.block_size > 0 ? r.block_size : kDefaultReadSize;
  a.max_memory = r.max_memory;
  if (a.max_memory == 0) {
    auto avail = facts.available_memory();  // unknown: nothing read ahead beyond the block
    const uint64_t m = avail.ok() ? *avail : 0;
    a.max_memory = a.remote ? m / 4 : m / 2;
  }
}

// The per-file strategies' sizes.
void size_per_file(const ReadRequest& r, ReadPath& p) {
  if (p.strategy == Strategy::kThreads) {
    const size_t files = std::max<size_t>(r.files, 1);
    p.workers = static_cast<int>(std::min<size_t>(r.threads > 0 ? static_cast<size_t>(r.threads) : 8, files));
  } else if (p.strategy == Strategy::kPrefetch) {
    p.prefetch_threads = r.threads > 0 ? r.threads : kDefaultPrefetchThreads;
    p.prefetch_block = r.block_size > 0 ? r.block_size : kDefaultPrefetchBlockSize;
  }
}

}  // namespace

std::string_view copy_source_name(CopySource s) { return s == CopySource::kMapped ? "mapped" : "slots"; }

StreamSetup fit_stream(StreamSetup s, uint64_t bytes) {
  if (bytes > 0 && s.read_size > 0)
    s.threads =
        static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(s.threads), (bytes + s.read_size - 1) / s.read_size));
  return s;
}

std::string StreamSetup::describe() const {
  std::string ring;
  if (!device.host_accessible() && !gds)
    ring = copy_source == CopySource::kMapped
               ? ", copies straight out of the page cache (registered read-only; WEIGHTLIFT_H2D_SOURCE=slot "
                 "stages them)"
               : fmt::format(", through {} pinned slots of {} KiB", slots, slot_bytes >> 10);
  return fmt::format("stream: {} threads, {} KiB reads, {}, to {}{}, memory cap {}", threads, read_size >> 10,
                     direct ? "O_DIRECT" : "buffered", device.to_string(), ring,
                     max_memory ? fmt::format("{} MiB", max_memory >> 20) : "none");
}

Result<ReadPath> choose(const ReadRequest& r, ReadFacts& given) {
  Asked facts(given);
  ReadPath p;
  p.strategy = r.strategy;
  p.max_memory = r.max_memory;
  p.file_views = r.file_views;
  if (r.distributed) {
    p.strategy = Strategy::kStream;
  } else if (r.strategy == Strategy::kAuto) {
    resolve_auto(r, facts, p);
  } else if (r.dest == DestKind::kDevice && r.strategy != Strategy::kStream && !r.device_as_asked) {
    device_streams(r, p);
  } else if (r.strategy == Strategy::kPrefetch && r.source == SourceKind::kLocal && !r.first_file.empty()) {
    std::string missing;
    p.prefetch = prefetch_rule(facts, /*requested=*/true, &missing);
    if (p.prefetch) p.log.push_back(p.prefetch->reason), p.warn = p.prefetch->warn;
  }
  p.file_views = p.file_views && r.dest == DestKind::kHost && p.strategy != Strategy::kStream;
  p.populate_views = r.populate_views || !p.file_views;

  Toggle direct = r.direct;
  if (views_from_cold_files(r, facts, p)) {
    p.strategy = Strategy::kStream;
    p.file_views = false;
    direct = Toggle::kAuto;
    if (p.max_memory == 0) p.max_memory = kColdViewsMemory;
  }
  if (p.strategy == Strategy::kStream) {
    WL_ASSIGN_OR_RETURN(p.gds, stream_gds(r, given, p));
    WL_ASSIGN_OR_RETURN(p.direct, stream_direct(r, direct, facts));
    WL_RETURN_IF_ERROR(size_the_stream(r, facts, p));
  }
  size_per_file(r, p);
  if (r.read_ahead) size_read_ahead(r, facts, p);
  return p;
}

}  // namespace wl
