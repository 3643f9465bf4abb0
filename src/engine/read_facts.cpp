// The facts of a planned load (PlanFacts) and the request of a load_files()
// call: what choose() is asked during a load.
#include "engine/read_facts.h"

#include "weightlift/prefetch.h"

namespace wl {

ReadRequest read_request(const std::vector<std::string>& files, const LoadOptions& o) {
  ReadRequest r;
  if (!files.empty()) {
    r.first_file = files[0];
    if (is_url(files[0])) r.source = SourceKind::kRemote;
  }
  if (Destination* d = o.destination) {
    r.device = d->device();
    r.dest = !r.device.host_accessible()              ? DestKind::kDevice
             : r.device.kind == DeviceKind::kCudaHost ? DestKind::kPinned
                                                      : DestKind::kCaller;
    if (Uploader* up = d->uploader())
      if (DirectReads* direct = up->direct_reads()) r.gds = direct->wish();
  }
  r.distributed = o.collective != nullptr;
  r.strategy = o.strategy;
  r.direct = o.direct;
  r.file_views = o.file_views;
  r.max_memory = o.max_memory;
  r.device_as_asked = o.switches.device_strategy_asked;
  return r;
}

namespace engine {

Result<std::optional<double>> PlanFacts::cached_fraction() {
  if (!plan_.files.empty() && is_url(plan_.files[0].path)) return std::optional<double>();
  return sample_residency(plan_.files.size(),
                          [&](size_t fi) { return open_data(plan_.files[fi], o_.env, FileMode::kPread); });
}

std::string PlanFacts::fs_type() { return files_.empty() ? std::string() : filesystem_type(files_[0], o_.system); }
Result<uint64_t> PlanFacts::checkpoint_bytes() { return checkpoint_size_bytes(files_, o_.env); }
Result<uint64_t> PlanFacts::available_memory() { return available_ram_bytes(o_.system); }

std::optional<bool> PlanFacts::contiguous() {
  for (const PlannedTensor& t : plan_.tensors)
    if (!t.file_offset) return false;
  return true;
}

Result<bool> PlanFacts::gds_usable(std::string* why) {
  Uploader* up = dest_ ? dest_->uploader() : nullptr;
  DirectReads* direct = up ? up->direct_reads() : nullptr;
  if (direct == nullptr || plan_.files.empty()) {
    *why = up ? "this uploader has no direct reads" : "no uploader";
    return false;
  }
  WL_ASSIGN_OR_RETURN(auto probe, open_data(plan_.files[0], o_.env, FileMode::kDirect));
  Status s = direct->support(*probe);
  if (!s.ok()) *why = s.message();
  return s.ok();
}

}  // namespace engine

}  // namespace wl
