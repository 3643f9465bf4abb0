// choose(): the one place that decides a load's read path (read_path.h lists
// the rules; tests/read_path_test.cpp has a row for each).
#include <fmt/format.h>

#include "weightlift/read_path.h"

namespace wl {

namespace {

// Asks each fact at most once (residency is consulted by two rules).
class Asked {
 public:
  explicit Asked(ReadFacts& f) : facts(f) {}
  Result<std::optional<double>> cached_fraction() {
    if (!cached_) cached_ = facts.cached_fraction();
    return *cached_;
  }
  ReadFacts& facts;

 private:
  std::optional<Result<std::optional<double>>> cached_;
};

// File views out of cold files: the stream strategy's memory cap when the caller set none.
constexpr uint64_t kColdViewsMemory = uint64_t{256} << 20;

// The prefetch rule over the facts; nullopt (and the reason in `p`) when a fact is missing.
std::optional<AutoDecision> prefetch_rule(ReadFacts& facts, bool requested, std::string* missing) {
  std::string fstype = facts.fs_type();
  auto bytes = facts.checkpoint_bytes();
  if (!bytes.ok()) return *missing = bytes.status().to_string(), std::nullopt;
  auto avail = facts.available_memory();
  if (!avail.ok()) return *missing = avail.status().to_string(), std::nullopt;
  return decide_prefetch(std::move(fstype), *bytes, *avail, requested);
}

// `auto`: which strategy runs.
void resolve_auto(const ReadRequest& r, ReadFacts& facts, ReadPath& p) {
  if (r.dest == DestKind::kDevice) {
    p.strategy = Strategy::kStream;
    p.log.push_back("auto: stream (a " + r.device.to_string() + " destination)");
  } else if (r.source == SourceKind::kArriving) {
    // Each tensor a view of the cache's partial file once its bytes arrived
    // (no second copy); into a destination, parallel readers.
    p.strategy = r.dest == DestKind::kHost ? Strategy::kLazy : Strategy::kStream;
    p.file_views = r.dest == DestKind::kHost;
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

}  // namespace

Result<ReadPath> choose(const ReadRequest& r, ReadFacts& given) {
  Asked facts(given);
  ReadPath p;
  p.strategy = r.strategy;
  p.max_memory = r.max_memory;
  p.file_views = r.file_views;
  if (r.distributed) {
    p.strategy = Strategy::kStream;
  } else if (r.strategy == Strategy::kAuto) {
    resolve_auto(r, given, p);
  } else if (r.dest == DestKind::kDevice && r.strategy != Strategy::kStream && !r.device_as_asked) {
    device_streams(r, p);
  } else if (r.strategy == Strategy::kPrefetch && r.source == SourceKind::kLocal && !r.first_file.empty()) {
    std::string missing;
    p.prefetch = prefetch_rule(given, /*requested=*/true, &missing);
    if (p.prefetch) p.log.push_back(p.prefetch->reason), p.warn = p.prefetch->warn;
  }
  p.file_views = p.file_views && r.dest == DestKind::kHost && p.strategy != Strategy::kStream;

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
  }
  return p;
}

}  // namespace wl
