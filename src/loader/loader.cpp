// load_files(): the public face of the engine. Checks the options, resolves
// `auto` with the page-cache policy, and runs the engine (src/engine/).
#include "weightlift/loader.h"

#include <fmt/format.h>

#include "engine/strategies.h"
#include "weightlift/prefetch.h"

namespace wl {

Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& o,
                             const std::function<Status(LoadedTensor&&)>& sink) {
  if (o.env == nullptr) return Status::InvalidArgument("LoadOptions.env is null");
  if (o.system == nullptr) return Status::InvalidArgument("LoadOptions.system is null");
  if (o.threads < 0) return Status::InvalidArgument(fmt::format("thread count {} is negative", o.threads));
  if (o.threads > 1024) return Status::InvalidArgument(fmt::format("thread count {} is above 1024", o.threads));
  if (o.block_size > (uint64_t{1} << 30)) return Status::InvalidArgument("block size is above 1 GiB");
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is outside [0, {})", o.tp_rank, o.tp_size));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return Status::InvalidArgument(fmt::format("rank {} is outside [0, {})", o.rank, o.world_size));
  if (o.collective != nullptr) return engine::run_distributed(files, o, sink);  // always streams

  Strategy s = o.strategy;
  if (s == Strategy::kAuto && o.destination && !o.destination->device().host_accessible()) {
    if (o.log) o.log("auto: stream (a " + o.destination->device().to_string() + " destination)");
    s = Strategy::kStream;
  }
  if (s == Strategy::kAuto) {
    auto dec = decide_auto(files, o.env, o.system);
    if (!dec.ok()) {
      if (o.log) o.log("auto: lazy (" + dec.status().to_string() + ")");
      s = Strategy::kLazy;
    } else {
      if (o.log) o.log(dec->reason);
      s = dec->stream ? Strategy::kStream : dec->prefetch ? Strategy::kPrefetch : Strategy::kLazy;
    }
  }
  auto r = engine::run_load(files, s, o, sink);
  if (!r.ok()) {
    // A file that a source is still writing may have failed to parse because its bytes are wrong:
    // the source's verdict (a hash mismatch naming the file) is the cause to report.
    const Status& st = r.status();
    if (!st.file().empty() && st.code() != Code::kCancelled)
      if (Status v = o.env->wait_complete(st.file()); !v.ok()) return v;
    return r;
  }
  LoadStats stats = *r;
  // Files a source was still writing (a Hub download) are final only once it says so.
  for (const auto& f : files) WL_RETURN_IF_ERROR(o.env->wait_complete(f));
  return stats;
}

}  // namespace wl
