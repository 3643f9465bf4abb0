// load_files(): the public face of the engine: plan_load() then execute()
// (load_plan.h), and the verdict of a source still writing the files.
#include "weightlift/loader.h"

#include "weightlift/text.h"

namespace wl {

Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& o,
                             const std::function<Status(LoadedTensor&&)>& sink,
                             const std::function<void(const LoadPlan&)>& planned) {
  auto r = [&]() -> Result<LoadStats> {
    WL_ASSIGN_OR_RETURN(LoadPlan plan, plan_load(files, o));
    if (planned) planned(plan);
    return execute(plan, sink);
  }();
  if (o.collective != nullptr || o.env == nullptr) return r;
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
