// load_files(): the public face of the engine. Checks the options and runs
// the engine (src/engine/), which asks choose() for the read path.
#include "weightlift/loader.h"

#include <fmt/format.h>

#include "engine/strategies.h"
#include "weightlift/text.h"

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
  if (o.collective != nullptr) return engine::run_distributed(files, o, sink);
  auto r = engine::run_load(files, o, sink);
  if (!r.ok()) {
    // A file that a source is still writing may have failed to parse because its bytes are wrong:
    // the source's verdict (a hash mismatch naming the file) is the cause to report.
    const Status& st = r.status();
    if (!st.file().empty() && st.code() != Code::kCancelled)
      for (const auto& f : files)  // the error names the file inertly (status.h): find it among the paths
        if (inert(f) == st.file())
          if (Status v = o.env->wait_complete(f); !v.ok()) return v;
    return r;
  }
  LoadStats stats = *r;
  // Files a source was still writing (a Hub download) are final only once it says so.
  for (const auto& f : files) WL_RETURN_IF_ERROR(o.env->wait_complete(f));
  return stats;
}

}  // namespace wl
