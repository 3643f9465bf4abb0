// weightlift/prefetch.h: page-cache prefetch and the prefetch rule of the
// `auto` strategy (the reference's: prefetch on a network filesystem when the
// checkpoint fits in 90% of available RAM, else lazy), which choose()
// (read_path.h) consults.
//
// System facts come through SystemInfo (weightlift/system.h) so tests can
// feed fakes. Functions are thread-safe; Prefetcher is used from one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/system.h"

namespace wl {

inline constexpr int kDefaultPrefetchThreads = 8;
inline constexpr uint64_t kDefaultPrefetchBlockSize = uint64_t{16} << 20;

// Sum of the files' sizes in bytes.
Result<uint64_t> checkpoint_size_bytes(const std::vector<std::string>& files, Env* env = Env::Default());

struct AutoDecision {
  bool prefetch = false;
  std::string fstype;
  uint64_t checkpoint_bytes = 0;
  uint64_t available_bytes = 0;
  std::string reason;  // one line for the log
  bool warn = false;   // the line is a warning (a network filesystem too small a RAM, or prefetch forced past 90%)
};
// The policy over the facts: prefetch when `fstype` is a network filesystem
// and the checkpoint fits in 90% of the available RAM. `requested` (an
// explicit "prefetch") always prefetches, warning when it does not fit.
AutoDecision decide_prefetch(std::string fstype, uint64_t checkpoint_bytes, uint64_t available_bytes,
                             bool requested = false);

struct PrefetchOptions {
  int threads = kDefaultPrefetchThreads;            // >= 1
  uint64_t block_size = kDefaultPrefetchBlockSize;  // >= 1
  int rank = 0, world_size = 1;                     // files[rank::world_size]
  Env* env = Env::Default();
  // One line at every 10% of files ("Prefetching checkpoint files: 10% (1/10)").
  std::function<void(const std::string&)> log;
};

// Reads files[rank::world_size] sequentially in blocks on `threads` workers so
// that the page cache holds them; a file already 90% cached is left alone.
// Per-file failures are logged and skipped.
// Invalid options are kInvalidArgument. Synchronous.
Status prefetch_files(const std::vector<std::string>& files, const PrefetchOptions& options);

// prefetch_files() on a background thread; the destructor stops early
// (between blocks) and joins.
class Prefetcher {
 public:
  static Result<std::unique_ptr<Prefetcher>> start(std::vector<std::string> files, PrefetchOptions options);
  ~Prefetcher();
  void wait();

 private:
  Prefetcher() = default;
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> stop_;
};

}  // namespace wl
